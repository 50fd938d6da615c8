"""placeholder"""

RADIX_CACHE_MUTANTS: tuple[object, ...] = ()
