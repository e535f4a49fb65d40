"""Argus exporters: the in-process probes that run inside training ranks (issue #3).

This package is importable as ``argus_exporters``. The probes, shipper and activation are not
built yet; the package exists so that the distribution layout (``exporters/`` mapped to
``argus_exporters``) is in place and the schema-v1 writers of ``argus_core.schema`` are what the
exporters will emit.
"""
