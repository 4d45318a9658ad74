"""A comment written after a value (oslo.config has no inline comments): an
error naming the file and line where a '#' cannot belong, a warning in a
free string; the sample's stand-in sections; where a message points."""

from __future__ import annotations

import pytest
from oslo_config import types

from accel_agent.config import comments as config_comments
from accel_agent.config import lint as config_lint
from accel_agent.config import values as config_values
from accel_agent.config.comments import Comment, inline_comment
from tests.unit.test_config_values import REGISTER_ALL, every_option, line_of, parse

# --- finding the comment -------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines, found",
    [
        (["4   # per GPU"], Comment("# per GPU", False)),
        (["node1\t#root"], Comment("#root", False)),
        (["true ; verbose"], Comment("; verbose", False)),
        (["# nothing"], Comment("# nothing", False)),
        (["0000:84:00.0,", "# 0000:85:00.0"], Comment("# 0000:85:00.0", True)),
        (["0000:84:00.0,", "0000:85:00.0  # the second"], Comment("# the second", False)),
        (["node1"], None),
        (["pass#word"], None),  # no blank before it: part of a word
        (["a;b"], None),
        (['"a # b"'], None),  # quoted: oslo.config takes what is inside, as meant
        (["'a # b'"], None),
        (['"a # b'], Comment("# b", False)),  # one quote is no quoting
        ([""], None),
        ([], None),
    ],
)
def test_the_comment_of_a_value_as_the_parser_assembles_it(lines, found):
    assert inline_comment(lines) == found


def _opt(section: str, name: str):
    return next(o for s, o in every_option() if s == section and o.dest == name)


@pytest.mark.parametrize(
    "section, name",
    [
        ("DEFAULT", "host"),  # a name: every provider name starts with it
        ("DEFAULT", "event_debounce"),  # float
        ("DEFAULT", "udev_events"),  # boolean
        ("DEFAULT", "debug"),  # oslo.log's boolean
        ("DEFAULT", "log_rotation_type"),  # choices
        ("api", "threads"),  # integer
        ("api", "socket_group"),
        ("devices", "enabled_mdev_types"),
        ("devices", "enabled_vf_pools"),
        ("mdev_nvidia-35", "device_addresses"),
        ("mdev_nvidia-35", "mdev_class"),  # regex
        ("mdev_nvidia-35", "max_instances"),
        ("vf_pool_nic", "device_addresses"),
        ("vf_pool_nic", "resource_class"),  # a String subclass with its own check
        ("vf_pool_nic", "traits"),
        ("vf_pool_nic", "num_vfs"),
        ("libvirt", "uri"),
        ("libvirt", "qemu_globals"),
        ("placement", "auth_url"),
        ("placement", "retriable_status_codes"),  # list of integers
        ("accel_agent_privileged", "capabilities"),
    ],
)
def test_options_a_hash_cannot_belong_to(section, name):
    assert config_comments.holds_no_comment(section, _opt(section, name))


@pytest.mark.parametrize(
    "section, name",
    [
        ("DEFAULT", "sysfs_root"),
        ("DEFAULT", "state_dir"),
        ("DEFAULT", "log_file"),
        ("DEFAULT", "logging_context_format_string"),
        ("api", "socket_path"),
        ("placement", "password"),
        ("placement", "username"),
        ("placement", "project_name"),
    ],
)
def test_free_strings_may_hold_a_hash(section, name):
    assert not config_comments.holds_no_comment(section, _opt(section, name))


def test_nova_s_legacy_section_is_the_per_type_one():
    opt = _opt("mdev_nvidia-35", "device_addresses")
    assert config_comments.section_kind("vgpu_nvidia-35") == "mdev_"
    assert config_comments.holds_no_comment("vgpu_nvidia-35", opt)


# Plain strings (no type, regex or choices), which holds_no_comment cannot
# tell from their type: each is a name (NAME_OPTIONS) or free, on purpose.
FREE_STRINGS = {
    ("DEFAULT", n) for n in (
        "sysfs_root", "state_dir", "vfio_dev_dir", "log_config_append", "log_date_format",
        "log_file", "log_dir", "logging_context_format_string",
        "logging_default_format_string", "logging_debug_format_suffix",
        "logging_exception_prefix", "logging_user_identity_format", "instance_format",
        "instance_uuid_format", "config_source", "config_dir",
    )
} | {("api", "socket_path")} | {
    ("placement", n) for n in (
        "cafile", "certfile", "keyfile", "tls_ciphers", "service_name", "region_name",
        "domain_name", "project_name", "project_domain_name", "default_domain_name",
        "username", "user_domain_name", "password",
    )
} | {
    (s, n) for s in ("accel_agent_privileged", "accel_agent_net_privileged",
                     "accel_agent_nvml_privileged")
    for n in ("helper_command", "logger_name")
}


def test_every_plain_string_option_is_a_name_or_free_on_purpose():
    plain = set()
    for section, opt in every_option():
        kind = opt.type.item_type if isinstance(opt.type, types.List) else opt.type
        if kind is str or (type(kind) is types.String and not kind.regex and not kind.choices):
            plain.add((config_comments.section_kind(section), opt.dest))
    assert plain - FREE_STRINGS == {
        pair for pair in config_comments.NAME_OPTIONS if pair in plain
    }
    assert not FREE_STRINGS & config_comments.NAME_OPTIONS
    # Every name listed is an option the daemon reads (no misspelt entry).
    assert plain >= config_comments.NAME_OPTIONS


# --- an error where a '#' cannot belong (check-config, start-up, reload) --------------------


@pytest.mark.parametrize(
    "section, line",
    [
        ("DEFAULT", "host = node1   # the root resource provider"),
        ("DEFAULT", "debug = true   # verbose"),
        ("DEFAULT", "event_debounce = 0.5  # seconds"),
        ("DEFAULT", "log_rotation_type = size  # or interval"),
        ("devices", "enabled_mdev_types = nvidia-35   # the M60's"),
        ("api", "socket_group = nova           # who may use the API socket"),
        ("mdev_nvidia-35", "max_instances = 4   # per physical GPU"),
        ("mdev_nvidia-35", "device_addresses = 0000:85:00.0, 86:00.0   # normalised"),
        ("mdev_nvidia-35", "mdev_class = VGPU ; the default"),
        ("vf_pool_nic", "num_vfs = 4   # written to sriov_numvfs"),
        ("vf_pool_nic", "resource_class = CUSTOM_NIC_A   # default SRIOV_NET_VF"),
        ("libvirt", "uri = qemu:///system   # the local one"),
        ("placement", "auth_url = http://keystone:5000/v3  # the identity service"),
    ],
)
def test_a_comment_after_a_value_a_hash_cannot_belong_to_is_an_error(tmp_path, section, line):
    conf, path = parse(tmp_path, REGISTER_ALL + f"[{section}]\n{line}\n")
    name, _, value = line.partition(" = ")
    comment = value[value.index(next(c for c in "#;" if f" {c}" in value)):]
    head = f"{path}:{line_of(path, line)}: [{section}] {name} = {value}: "
    (error,) = config_values.value_errors(conf)
    assert error == head + (
        f"oslo.config has no inline comments, {comment!r} is part of the value; put the "
        "comment on a line of its own"
    )


def test_a_comment_line_indented_into_a_value_is_named(tmp_path):
    conf, path = parse(
        tmp_path, REGISTER_ALL + "[mdev_nvidia-35]\ndevice_addresses = 0000:84:00.0,\n"
        "    # 0000:85:00.0\n"
    )
    (error,) = config_values.value_errors(conf)
    assert error.startswith(
        f"{path}:{line_of(path, 'device_addresses = 0000:84')}: [mdev_nvidia-35] "
        "device_addresses = "
        "0000:84:00.0,: oslo.config has no inline comments, '# 0000:85:00.0' is part of the "
        "value; an indented line continues the value above it"
    ), error


@pytest.mark.parametrize(
    "line",
    [
        "host = node1",
        "host = node#1",  # not after a blank: no comment
        'host = "node1 # kept, as quoted"',  # quoted: meant
        "log_file = /var/log/a#b.log",
    ],
)
def test_a_value_without_an_inline_comment_is_no_error(tmp_path, line):
    conf, _path = parse(tmp_path, REGISTER_ALL + f"[DEFAULT]\n{line}\n")
    assert config_values.value_errors(conf) == []


def test_the_comment_is_looked_for_in_the_line_oslo_config_took_the_value_from(tmp_path):
    conf, path = parse(tmp_path, "[DEFAULT]\nhost = a   # first\nhost = b\n")
    assert config_values.value_errors(conf) == []
    conf, path = parse(tmp_path, "[DEFAULT]\nhost = a\nhost = b   # second\n")
    (error,) = config_values.value_errors(conf)
    assert error.startswith(f"{path}:{line_of(path, 'host = b')}: [DEFAULT] host = b   #")


def test_a_value_from_the_environment_is_taken_as_it_is(tmp_path, monkeypatch):
    # The environment's value is the one read; the file's, with its comment, is not.
    monkeypatch.setenv("OS_DEFAULT__HOST", "node1")
    conf, _path = parse(tmp_path, "[DEFAULT]\nhost = node1   # the root provider\n")
    assert config_values.value_errors(conf) == []


# --- a warning in a free string ---------------------------------------------------------


def lint(tmp_path, text: str) -> tuple[list[str], object]:
    _conf, path = parse(tmp_path, text)
    return config_lint.lint([str(path)]), path


def test_a_comment_in_a_free_string_is_a_warning_naming_file_and_line(tmp_path):
    warnings, path = lint(tmp_path, "log_file = /var/log/agent.log   # rotated daily\n")
    assert warnings == [
        f"{path}:{line_of(path, 'log_file')}: [DEFAULT] log_file = /var/log/agent.log   # "
        "rotated daily: '# rotated daily' is part of the value (oslo.config has no inline "
        "comments); if it is a comment, put the comment on a line of its own; if the '#' "
        "belongs to the value, quote the value"
    ]
    conf, _ = parse(tmp_path, "log_file = /var/log/agent.log   # rotated daily\n")
    assert config_values.value_errors(conf) == []  # a warning, not an error


def test_a_secret_s_value_is_not_shown(tmp_path):
    warnings, path = lint(
        tmp_path, "[placement]\nauth_type = password\npassword = s3cr3t #tail\n"
    )
    (warning,) = warnings
    assert warning.startswith(f"{path}:{line_of(path, 'password = ')}: [placement] password = **")
    assert "s3cr3t" not in warning and "tail" not in warning


def test_a_quoted_free_string_is_no_warning(tmp_path):
    warnings, _path = lint(tmp_path, 'log_file = "/var/log/a #1.log"\n')
    assert warnings == []


def test_an_option_a_hash_cannot_belong_to_is_not_warned_about_too(tmp_path):
    # config/values.py refuses it: one message, not a warning beside the error.
    warnings, _path = lint(tmp_path, "host = node1   # the root provider\n")
    # parse() writes "host = h" above it: host set twice is warned about, the
    # comment is not.
    assert [w for w in warnings if " is set again " not in w] == []
    assert len(warnings) == 1


# --- the sample's stand-in sections; [vf_pool_<name>] ------------------------------------


def test_the_sample_s_stand_in_sections_with_nothing_set_are_no_warning(tmp_path):
    warnings, _path = lint(
        tmp_path, "[mdev_$(mdev_type)]\n#device_addresses =\n[vf_pool_$(pool)]\n#num_vfs =\n"
    )
    assert warnings == []


@pytest.mark.parametrize(
    "section, line, example",
    [
        ("mdev_$(mdev_type)", "device_addresses = 0000:84:00.0", "mdev_nvidia-35"),
        ("vf_pool_$(pool)", "num_vfs = 4", "vf_pool_nic_a"),
    ],
)
def test_an_option_set_in_a_stand_in_section_is_a_warning(tmp_path, section, line, example):
    warnings, path = lint(tmp_path, f"[{section}]\n{line}\n")
    name = line.partition(" = ")[0]
    assert warnings == [
        f"{path}:{line_of(path, line)}: {name} is set in [{section}], the sample's stand-in "
        "for one section per name; it applies to nothing: name the section after the "
        f"{'type' if section.startswith('mdev') else 'pool'}, e.g. [{example}]"
    ]


def test_a_vf_pool_section_is_known_and_a_misspelt_one_is_not(tmp_path):
    warnings, path = lint(
        tmp_path,
        "[devices]\nenabled_vf_pools = nic_a\n[vf_pool_nic_a]\ndevice_addresses = 0000:10:00.0"
        "\nresource_class = CUSTOM_NIC_A\ntraits = CUSTOM_FAST\nnum_vfs = 2\n"
        "[vf_pools_nic_b]\nnum_vfs = 2\n",
    )
    assert warnings == [
        f"{path}:{line_of(path, '[vf_pools_nic_b]')}: unknown section [vf_pools_nic_b]; it is "
        "ignored"
    ]


# --- where a message points (check-config --json) ---------------------------------------


@pytest.mark.parametrize(
    "message, where",
    [
        ("/etc/a.conf:12: [DEFAULT] event_debounce = 50: must be at most 10",
         ("/etc/a.conf", 12, "DEFAULT", "event_debounce")),
        ("/etc/a b.conf:3: [mdev_nvidia-35] max_instances = 4   # x: oslo.config has no ...",
         ("/etc/a b.conf", 3, "mdev_nvidia-35", "max_instances")),
        ("/etc/a.conf:7: unknown option device_adresses in [mdev_nvidia-36]; it is ignored; "
         "did you mean device_addresses?", ("/etc/a.conf", 7, "mdev_nvidia-36",
                                            "device_adresses")),
        ("/etc/a.conf:9: unknown section [devics]; it is ignored",
         ("/etc/a.conf", 9, "devics", None)),
        ("/etc/a.conf:4: the indented section header [mdev_x] is read as the continuation",
         ("/etc/a.conf", 4, "mdev_x", None)),
        ("/etc/a.conf:5: num_vfs is set in [vf_pool_$(pool)], the sample's stand-in",
         ("/etc/a.conf", 5, "vf_pool_$(pool)", "num_vfs")),
        ("environment variable OS_DEFAULT__DEBUG: [DEFAULT] debug = x: not a boolean",
         (None, None, "DEFAULT", "debug")),
        ("[vf_pool_nic] device_addresses: 0000:3b:00.0: no PCI device 0000:3b:00.0 under /sys",
         (None, None, "vf_pool_nic", "device_addresses")),
        ("[DEFAULT] state_dir /var/lib/x is not a directory",
         (None, None, "DEFAULT", "state_dir")),
        ("section [mdev_nvidia-11] is ignored: type nvidia-11 is not in [devices] "
         "enabled_mdev_types", (None, None, "mdev_nvidia-11", None)),
        ("Invalid configuration for mdev-capable devices: incorrect device address: whoops "
         "(in [mdev_nvidia-36] device_addresses; expected a PCI address",
         (None, None, "mdev_nvidia-36", "device_addresses")),
        ("config file /etc/a.conf is not UTF-8 text (byte 0xe9 on line 4)",
         ("/etc/a.conf", 4, None, None)),
        ("Invalid configuration: --config-file /etc/x is a directory; give a directory of "
         "*.conf files with --config-dir", ("/etc/x", None, None, None)),
        ("Invalid configuration: config file /etc/a.conf is not UTF-8 text (byte 0xe9 on "
         "line 4)", ("/etc/a.conf", 4, None, None)),
        ("Invalid configuration: config file not found: ['/etc/nope.conf']",
         ("/etc/nope.conf", None, None, None)),
        ("0000:42:00.0 (configured for nvidia-35) is not an mdev parent on this host",
         (None, None, None, None)),
        ("sysfs: parent 0000:84:00.0: numa_node -1; ignored", (None, None, None, None)),
    ],
)
def test_where_a_check_config_message_points(message, where):
    found = config_lint.locate(message)
    assert (found.file, found.line, found.section, found.option) == where
