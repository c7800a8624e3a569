# cmake -DREADME=<README.md> -DSOURCE=<file.cpp> -DNAME=<region> -P check_snippet.cmake
# Fails unless the README's fenced code between `<!-- example-begin NAME -->` and
# `<!-- example-end NAME -->` equals the region of SOURCE between `// example-begin NAME` and
# `// example-end NAME` (the source is compiled and run by the package tests, so the README's
# code is too).
cmake_minimum_required(VERSION 3.25)

foreach(v README SOURCE NAME)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_snippet.cmake: -D${v}=... is required")
  endif()
endforeach()

# Sets out_var to the text strictly between the line holding `begin` and the line holding `end`.
function(extract_region file begin end out_var)
  file(READ ${file} text)
  string(REPLACE "\r\n" "\n" text "${text}")
  string(FIND "${text}" "${begin}" b)
  if(b EQUAL -1)
    message(FATAL_ERROR "${file}: no `${begin}` marker")
  endif()
  string(FIND "${text}" "${begin}" b_last REVERSE)
  if(NOT b EQUAL b_last)
    message(FATAL_ERROR "${file}: `${begin}` appears more than once")
  endif()
  string(SUBSTRING "${text}" ${b} -1 rest)
  string(FIND "${rest}" "\n" nl)
  math(EXPR nl "${nl} + 1")
  string(SUBSTRING "${rest}" ${nl} -1 rest)  # drop the begin marker's line
  string(FIND "${rest}" "${end}" e)
  if(e EQUAL -1)
    message(FATAL_ERROR "${file}: no `${end}` after `${begin}`")
  endif()
  string(SUBSTRING "${rest}" 0 ${e} region)
  string(FIND "${region}" "\n" last_nl REVERSE)  # drop the end marker's line prefix
  math(EXPR keep "${last_nl} + 1")
  string(SUBSTRING "${region}" 0 ${keep} region)
  set(${out_var} "${region}" PARENT_SCOPE)
endfunction()

extract_region(${README} "<!-- example-begin ${NAME} -->" "<!-- example-end ${NAME} -->" doc)
extract_region(${SOURCE} "// example-begin ${NAME}" "// example-end ${NAME}" code)

# The README's region is one fenced block: ```cpp ... ```.
string(FIND "${doc}" "```cpp\n" fence_open)
string(FIND "${doc}" "```\n" fence_close REVERSE)
if(NOT fence_open EQUAL 0 OR fence_close LESS 7)
  message(FATAL_ERROR "${README}: the `${NAME}` region must be exactly one ```cpp fenced block")
endif()
math(EXPR len "${fence_close} - 7")
string(SUBSTRING "${doc}" 7 ${len} doc)

if(NOT doc STREQUAL code)
  message("--- ${README} (region ${NAME}):\n${doc}--- ${SOURCE} (region ${NAME}):\n${code}---")
  message(FATAL_ERROR "The README's `${NAME}` snippet differs from ${SOURCE}; copy the code "
                      "region into the README (the source is the one that is compiled).")
endif()
message(STATUS "README snippet `${NAME}` matches ${SOURCE}")
