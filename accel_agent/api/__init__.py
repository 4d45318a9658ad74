"""The agent's local HTTP/JSON API on a unix socket (docs/design.md §6.3).

* ``openapi.json`` -- the contract: routes, parameters, bodies, answers.
* :mod:`.app` -- the WSGI application (routing table, OpenAPI validation).
* :mod:`.handlers` -- one function per operation and the ``ROUTES`` table.
* :mod:`.errors` -- agent exceptions -> HTTP statuses, in one table.
* :mod:`.server` -- the socket (0660, safety checks) and cheroot in front.
* :mod:`.client` -- the stdlib-only client accelctl uses.

Nothing is imported here: ``accelctl`` imports :mod:`.client` alone.
"""
