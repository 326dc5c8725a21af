# alloc_fail.cmake - the allocation-failure test (tests/test_alloc_fail.c)
# defines __wrap_malloc, __wrap_calloc and __wrap_realloc; linking it with
# --wrap sends every call from libepx's objects there, so the test can fail
# the n-th allocation. Only this one test is linked this way.
if(TARGET test_alloc_fail)
  target_link_options(test_alloc_fail PRIVATE
                      -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc)
endif()
