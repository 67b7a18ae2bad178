# SPDX-License-Identifier: BSD-3-Clause
# Each public header in include/mrcache/ compiled alone, twice in a row (include guards), with
# only include/ on the path: as C11 and as C++ for a .h, as C++ for a .hpp. Warnings are the
# consumer's kind (-Wall -Wextra -Wpedantic), plus our full set for the C++ layer (.hpp).
# Built as part of `all`; a header that needs another one included first fails the build.
file(GLOB MRC_PUBLIC_HEADERS CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/mrcache/*.h ${PROJECT_SOURCE_DIR}/include/mrcache/*.hpp)

set(MRC_HEADER_CHECK_SOURCES)
foreach(header ${MRC_PUBLIC_HEADERS})
  get_filename_component(header_name ${header} NAME)
  string(MAKE_C_IDENTIFIER ${header_name} header_id)
  # The typedef keeps an empty header from making an empty (ill-formed in ISO C) unit.
  string(CONCAT body
         "/* Self-containment check (cmake/MrcHeaderCheck.cmake): a public header must compile\n"
         " * alone. An error below means <mrcache/${header_name}> uses something it does not\n"
         " * include itself: add the #include it needs to the header. */\n"
         "#include <mrcache/${header_name}>\n#include <mrcache/${header_name}>\n"
         "typedef int mrc_header_check_${header_id};\n")
  set(stem ${PROJECT_BINARY_DIR}/header_check/${header_id})
  if(header_name MATCHES "\\.h$")
    file(CONFIGURE OUTPUT ${stem}.c CONTENT "${body}")
    list(APPEND MRC_HEADER_CHECK_SOURCES ${stem}.c)
    set_source_files_properties(${stem}.c PROPERTIES COMPILE_OPTIONS "-Wpedantic;-Wstrict-prototypes")
  endif()
  file(CONFIGURE OUTPUT ${stem}.cc CONTENT "${body}")
  list(APPEND MRC_HEADER_CHECK_SOURCES ${stem}.cc)
  if(header_name MATCHES "\\.hpp$")
    set_source_files_properties(${stem}.cc PROPERTIES COMPILE_OPTIONS "${MRC_WARNINGS};-Wpedantic")
  else()
    set_source_files_properties(${stem}.cc PROPERTIES COMPILE_OPTIONS "-Wpedantic")
  endif()
endforeach()

if(MRC_HEADER_CHECK_SOURCES)
  add_library(mrc_header_check OBJECT ${MRC_HEADER_CHECK_SOURCES})
  set_target_properties(mrc_header_check PROPERTIES C_EXTENSIONS OFF CXX_EXTENSIONS OFF)
  target_include_directories(mrc_header_check PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(mrc_header_check PRIVATE -Wall -Wextra $<$<BOOL:${MRC_WERROR}>:-Werror>)
endif()
