"""SGLang 0.5.x adapter: the policy core inside SGLang's scheduler and radix cache.

Importing this package imports nothing of SGLang (the ``.pth`` of the CPU test environment imports
:mod:`.cpu_compat` at every interpreter start). :mod:`.plugin` is the entry point SGLang loads.
"""
