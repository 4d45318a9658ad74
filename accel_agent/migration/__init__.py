"""Live migration with mdevs: destination claims, version gates, source XML rewrite."""
