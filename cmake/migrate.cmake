# Migrations between real MPI processes (tests/mpi/test_mpi_migrate.c):
# random migrations and corrupted blocks on 2-4 ranks, and a rank killed in
# the middle of a migration (tests/mpi/migrate_kill.sh). Needs the MPI
# communicator (cmake/mpi.cmake, included before this file). The migration
# logic itself is tested without MPI by tests/test_migrate_*.c (ranks as
# threads, also under ASan); these carry the labels "mpi;no-asan" because
# Open MPI's own allocations upset LeakSanitizer.
if(NOT EPX_HAVE_MPI OR NOT TARGET epx_mpi OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()

add_executable(test_mpi_migrate ${CMAKE_SOURCE_DIR}/tests/mpi/test_mpi_migrate.c)
target_compile_options(test_mpi_migrate PRIVATE ${EPX_WARNINGS})
target_include_directories(test_mpi_migrate PRIVATE ${CMAKE_SOURCE_DIR}/tests/util)
target_link_libraries(test_mpi_migrate PRIVATE epx_mpi)

foreach(np 2 3 4)
  add_test(NAME mpi_migrate_np${np}
           COMMAND ${EPX_MPIRUN} -np ${np} $<TARGET_FILE:test_mpi_migrate> run)
  set_tests_properties(mpi_migrate_np${np} PROPERTIES LABELS "mpi;no-asan" TIMEOUT 180
                       ENVIRONMENT "${EPX_TEST_ENV};${EPX_MPI_ENV}" RUN_SERIAL TRUE)
endforeach()
foreach(chunk 0 1)
  add_test(NAME mpi_migrate_kill_chunk${chunk}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/migrate_kill.sh ${MPIEXEC_EXECUTABLE} 3
                   $<TARGET_FILE:test_mpi_migrate> ${chunk})
  set_tests_properties(mpi_migrate_kill_chunk${chunk} PROPERTIES LABELS "mpi;no-asan" TIMEOUT 120
                       ENVIRONMENT "${EPX_TEST_ENV};${EPX_MPI_ENV}" RUN_SERIAL TRUE)
endforeach()
