# The `docs` target: Doxygen over the public headers (docs/Doxyfile) plus the generated
# kvc/config.h, into <build>/docs/html. Warnings are errors (WARN_AS_ERROR in docs/Doxyfile).
# Without doxygen there is no `docs` target, and configuring says so.
find_package(Doxygen 1.9 OPTIONAL_COMPONENTS dot)
if(NOT DOXYGEN_FOUND)
  message(STATUS "kvc: doxygen not found; no `docs` target")
  return()
endif()

if(Doxygen_dot_FOUND)
  set(KVC_DOXYGEN_HAVE_DOT YES)
  get_filename_component(KVC_DOXYGEN_DOT_PATH "${DOXYGEN_DOT_EXECUTABLE}" DIRECTORY)
else()
  set(KVC_DOXYGEN_HAVE_DOT NO)
  set(KVC_DOXYGEN_DOT_PATH "")
endif()

# docs/Doxyfile holds every setting; this wrapper only points it at absolute paths, the build
# folder and the installed-version number.
set(KVC_DOXYFILE ${PROJECT_BINARY_DIR}/docs/Doxyfile)
file(CONFIGURE OUTPUT ${KVC_DOXYFILE} CONTENT [=[
@INCLUDE               = "@PROJECT_SOURCE_DIR@/docs/Doxyfile"
PROJECT_NUMBER         = @PROJECT_VERSION@
OUTPUT_DIRECTORY       = "@PROJECT_BINARY_DIR@/docs"
INPUT                  = "@PROJECT_SOURCE_DIR@/include/kvc" \
                         "@PROJECT_BINARY_DIR@/include/kvc/config.h"
STRIP_FROM_PATH        = "@PROJECT_SOURCE_DIR@/include" "@PROJECT_BINARY_DIR@/include"
STRIP_FROM_INC_PATH    = "@PROJECT_SOURCE_DIR@/include" "@PROJECT_BINARY_DIR@/include"
INCLUDE_PATH           = "@PROJECT_SOURCE_DIR@/include" "@PROJECT_BINARY_DIR@/include"
EXAMPLE_PATH           = "@PROJECT_SOURCE_DIR@/tests/package/consumer"
HAVE_DOT               = @KVC_DOXYGEN_HAVE_DOT@
DOT_PATH               = "@KVC_DOXYGEN_DOT_PATH@"
]=] @ONLY)

# Always runs (a few seconds): no stale reference after a header changes.
add_custom_target(docs
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${PROJECT_BINARY_DIR}/docs/html
  COMMAND Doxygen::doxygen ${KVC_DOXYFILE}
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMENT "Doxygen: API reference in ${PROJECT_BINARY_DIR}/docs/html (warnings are errors)"
  VERBATIM)
message(STATUS "kvc: `docs` target: doxygen ${DOXYGEN_VERSION}, graphs ${KVC_DOXYGEN_HAVE_DOT}")
