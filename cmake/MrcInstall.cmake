# SPDX-License-Identifier: BSD-3-Clause
# Installation: the public headers, libmrcache.so (with its soname links) and libmrcache.a, the
# CMake package (find_package(mrcache) -> mrcache::mrcache, mrcache::mrcache_static) and
# mrcache.pc. tests/install/ checks all of it against an installed tree.
include(CMakePackageConfigHelpers)

set(MRC_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mrcache)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mrcache
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT mrcache_development
  FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
install(TARGETS mrcache mrcache_static EXPORT mrcacheTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT mrcache_runtime
    NAMELINK_COMPONENT mrcache_development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT mrcache_development
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mrcacheTargets NAMESPACE mrcache:: FILE mrcacheTargets.cmake
  DESTINATION ${MRC_CMAKE_PACKAGE_DIR} COMPONENT mrcache_development)

# mrcacheConfig.cmake recreates the imported targets that libmrcache.a's link interface names
# (the shared library hides its dependencies: they are DT_NEEDED entries, nothing more).
configure_package_config_file(cmake/mrcacheConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mrcacheConfig.cmake
  INSTALL_DESTINATION ${MRC_CMAKE_PACKAGE_DIR}
  NO_CHECK_REQUIRED_COMPONENTS_MACRO)
# 0.x releases only add to the ABI (symbol versions, sized structs: docs/DESIGN.md "C ABI"), so
# find_package(mrcache 0.1) accepts 0.2; a new major (a new soname) would not be accepted.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mrcacheConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mrcacheConfig.cmake
  ${PROJECT_BINARY_DIR}/mrcacheConfigVersion.cmake
  DESTINATION ${MRC_CMAKE_PACKAGE_DIR} COMPONENT mrcache_development)

# mrcache.pc is relocatable: its prefix is found from the .pc file's own place (${pcfiledir}),
# so `cmake --install build --prefix DIR` gives a tree that works wherever DIR is.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(MRC_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(MRC_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(MRC_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH MRC_PC_UP "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" MRC_PC_UP "${MRC_PC_UP}")
  set(MRC_PC_PREFIX "\${pcfiledir}/${MRC_PC_UP}")
  set(MRC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(MRC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# Static linking (pkg-config --static) needs what libmrcache.a's objects use: the libraries
# that ship a .pc file go to Requires.private, the C++ runtime and libpthread to Libs.private
# (a C program's link line has no libstdc++ of its own).
set(MRC_PC_REQUIRES_PRIVATE "liburing, numa")
if(MRC_WITH_VERBS)
  string(APPEND MRC_PC_REQUIRES_PRIVATE ", libibverbs")
endif()
if(MRC_BPF_ENABLED)
  string(APPEND MRC_PC_REQUIRES_PRIVATE ", libbpf")
endif()
if(MRC_FMT_LINKED)
  string(APPEND MRC_PC_REQUIRES_PRIVATE ", fmt")
endif()
set(MRC_PC_LIBS_PRIVATE "-lstdc++ -lm -pthread")
configure_file(cmake/mrcache.pc.in ${PROJECT_BINARY_DIR}/mrcache.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mrcache.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT mrcache_development)

# The licence travels with the binaries (BSD-3-Clause asks redistributions to carry it).
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR}
  COMPONENT mrcache_runtime)
