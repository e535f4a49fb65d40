"""Vector configs checked without the Vector binary (which cannot be installed here).

``config`` loads files the way Vector does (environment interpolation, several files merged),
``schema`` validates them against Vector's own JSON schema, ``topology`` checks the graph,
``vrl`` compiles and runs every VRL program with pyvrl under the remap/route semantics,
``unit_tests`` executes the configs' Vector-native ``tests:`` blocks through that VRL, and
``wire`` models the bodies Vector's ``http_server`` source decodes and its ``http`` sink sends.
"""
