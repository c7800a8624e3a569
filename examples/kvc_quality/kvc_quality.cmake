# kvc_quality, the synthetic retrieval suite (docs/quality.md): a static library of the suite
# (case generation, the pipeline run, reports) and the program. Included by the program's folder
# (examples/kvc_quality) and by its tests (tests/quality), whichever comes first defines them.
include_guard(GLOBAL)

set(KVC_QUALITY_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(kvc_quality_lib STATIC
  ${KVC_QUALITY_DIR}/needles.cpp
  ${KVC_QUALITY_DIR}/suite.cpp
  ${KVC_QUALITY_DIR}/report.cpp)
target_include_directories(kvc_quality_lib PUBLIC ${KVC_QUALITY_DIR})
target_link_libraries(kvc_quality_lib PUBLIC kvc::kvc)
target_compile_options(kvc_quality_lib PRIVATE -Wall -Wextra)

add_executable(kvc_quality ${KVC_QUALITY_DIR}/main.cpp)
target_link_libraries(kvc_quality PRIVATE kvc_quality_lib)
target_compile_options(kvc_quality PRIVATE -Wall -Wextra)
# One place for the program, whichever folder defined it: build/examples/kvc_quality/kvc_quality.
set_target_properties(kvc_quality PROPERTIES
                      RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/examples/kvc_quality)
