# Tests mirror the source tree: one GoogleTest executable per layer folder under tests/.
include(GoogleTest)

function(smelt_test_folder folder)
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/tests/${folder}/*.cpp ${CMAKE_CURRENT_SOURCE_DIR}/tests/${folder}/*.cu)
  if(NOT sources)
    return()
  endif()
  add_executable(test_${folder} ${sources} ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_main.cpp)
  target_include_directories(test_${folder} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
  target_link_libraries(test_${folder} PRIVATE smelt_train GTest::gtest)
  target_compile_definitions(test_${folder} PRIVATE SMELT_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}" SMELT_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(folder STREQUAL "apps")
    add_dependencies(test_${folder} smelt)  # the CLI tests run the binary
  endif()
  set(labels ${folder})
  if(folder STREQUAL "cuda")
    list(APPEND labels gpu)
  endif()
  gtest_discover_tests(test_${folder}
    PROPERTIES LABELS "${labels}" SKIP_REGULAR_EXPRESSION "  SKIPPED "
      # ctest runs tests side by side on few cores: threads that spin while waiting
      # (OpenMP's default) would steal the cores the other tests compute on.
      ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE"
    DISCOVERY_TIMEOUT 60)
endfunction()

foreach(folder core cpu model plan train data dist apps)
  smelt_test_folder(${folder})
endforeach()
if(SMELT_CUDA)
  smelt_test_folder(cuda)
endif()
