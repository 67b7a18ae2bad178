# Installation: headers, both libraries, the CMake package (mrcache::mrcache) and mrcache.pc.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/mrcache DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mrcache mrcache_static EXPORT mrcacheTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mrcacheTargets NAMESPACE mrcache:: FILE mrcacheTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrcache)
configure_package_config_file(cmake/mrcacheConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/mrcacheConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrcache)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mrcacheConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mrcacheConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/mrcacheConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrcache)

set(MRC_PC_REQUIRES_PRIVATE "liburing fmt")
if(MRC_WITH_VERBS)
  string(APPEND MRC_PC_REQUIRES_PRIVATE " libibverbs")
endif()
configure_file(cmake/mrcache.pc.in ${CMAKE_CURRENT_BINARY_DIR}/mrcache.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mrcache.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
