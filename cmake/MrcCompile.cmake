# SPDX-License-Identifier: BSD-3-Clause
# Compile flags shared by every target of the project.
#
# Convention: library code (pgtable, uffd, backends, core) is built without exceptions and
# without RTTI; expected failures are mrc_status_t values. Tools and tests may use exceptions
# (CLI11, nlohmann-json and GoogleTest need them).

set(MRC_WARNINGS -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Wunused -Woverloaded-virtual -Wconversion -Wsign-conversion -Wnull-dereference
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
set(MRC_C_WARNINGS -Wall -Wextra -Wshadow -Wconversion -Wformat=2 -Wstrict-prototypes)
# GCC 12 at -O3 reports impossible overlaps inside std::string's inlined copies (GCC PR 105329).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND MRC_WARNINGS -Wno-restrict)
endif()
# clang checks the locking contracts written with base/mutex.h's annotations (docs/DESIGN.md,
# "Contracts the compiler checks"); GCC has no such analysis and ignores them.
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  list(APPEND MRC_WARNINGS -Wthread-safety -Wthread-safety-beta)
endif()
if(MRC_WERROR)
  list(APPEND MRC_WARNINGS -Werror)
  list(APPEND MRC_C_WARNINGS -Werror)
endif()

set(MRC_SANITIZE_FLAGS)
if(MRC_SANITIZE)
  list(APPEND MRC_SANITIZE_FLAGS -fsanitize=${MRC_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${MRC_SANITIZE_FLAGS})
  add_link_options(${MRC_SANITIZE_FLAGS})
  if(MRC_SANITIZE MATCHES "thread")
    add_compile_definitions(MRC_TSAN=1)
  endif()
endif()

# Flags for a target of ours (library or program).
function(mrc_target_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${MRC_WARNINGS}>
    $<$<COMPILE_LANGUAGE:C>:${MRC_C_WARNINGS}>)
endfunction()

# An internal component of libmrcache: position-independent objects, hidden symbols, no
# exceptions, private headers reachable as "component/header.h" from the source root.
function(mrc_component name)
  add_library(mrc_${name} OBJECT ${ARGN})
  set_target_properties(mrc_${name} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(mrc_${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(mrc_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-exceptions -fno-rtti>)
  target_compile_definitions(mrc_${name} PRIVATE MRC_BUILDING_LIBRARY=1)
  mrc_target_flags(mrc_${name})
endfunction()
