# Sanitizer and fuzzing builds (docs/reliability.md). Included by the top-level CMakeLists.txt
# before any target is defined, so the flags reach the library, the tests and the fuzzers alike.
#
#   KVC_SANITIZE       list for -fsanitize= applied to every C++ target, e.g. "address,undefined"
#                      (the `asan` preset); empty: no sanitizer. CPU builds only: nvcc-compiled
#                      code is not instrumented (use compute-sanitizer on the device instead).
#   KVC_BUILD_FUZZERS  builds the libFuzzer targets of fuzz/ (clang only): everything is compiled
#                      with -fsanitize=fuzzer-no-link plus KVC_SANITIZE (default address,undefined)
#                      so the fuzzers see coverage of the library; the top-level file then adds
#                      fuzz/. scripts/fuzz drives it.
#
# Every sanitizer report aborts (-fno-sanitize-recover=all), so a test or a fuzz run fails on
# the first finding instead of printing it and carrying on.
include_guard(GLOBAL)

set(KVC_SANITIZE "" CACHE STRING "Sanitizers for -fsanitize= (e.g. address,undefined); empty: off")
option(KVC_BUILD_FUZZERS "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(KVC_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVC_BUILD_FUZZERS needs clang (libFuzzer); CMAKE_CXX_COMPILER_ID is "
                        "${CMAKE_CXX_COMPILER_ID}. Configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "or run scripts/fuzz.")
  endif()
  if(NOT KVC_SANITIZE)
    set(KVC_SANITIZE "address,undefined")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  # The top-level CMakeLists.txt adds fuzz/ after the library (if(KVC_BUILD_FUZZERS)).
endif()

if(KVC_SANITIZE)
  if(KVC_CUDA_ENABLED)
    message(WARNING "KVC_SANITIZE=${KVC_SANITIZE} with CUDA on: only host C++ code is "
                    "instrumented; the sanitizer presets build with KVC_WITH_CUDA=OFF")
  endif()
  message(STATUS "kvc: sanitizers ${KVC_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${KVC_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${KVC_SANITIZE})
endif()
