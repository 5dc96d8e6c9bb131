# cmake --install: the static libraries, the headers, SLEEF beside them, and a package config so
# that an outside project does find_package(lazyfuse CONFIG REQUIRED) and links lazyfuse::lazyfuse.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS lazyfuse lazyfuse_frontend lazyfuse_runtime lazyfuse_codegen lazyfuse_ir
        EXPORT lazyfuseTargets
        ARCHIVE DESTINATION lib)
install(TARGETS lazyfuse_cli walkthrough RUNTIME DESTINATION bin)
foreach(layer ir codegen runtime frontend)
  install(DIRECTORY ${layer}/ DESTINATION include/lazyfuse/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.def")
endforeach()
install(FILES include/lazyfuse/lazyfuse.h DESTINATION include/lazyfuse)
install(FILES ${PROJECT_BINARY_DIR}/lib/libsleef.so.3 DESTINATION lib)
install(EXPORT lazyfuseTargets NAMESPACE lazyfuse:: DESTINATION lib/cmake/lazyfuse)
configure_package_config_file(cmake/lazyfuseConfig.cmake.in
  ${PROJECT_BINARY_DIR}/lazyfuseConfig.cmake INSTALL_DESTINATION lib/cmake/lazyfuse)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lazyfuseConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lazyfuseConfig.cmake
              ${PROJECT_BINARY_DIR}/lazyfuseConfigVersion.cmake
              cmake/lazyfuseStaticAbsl.cmake
        DESTINATION lib/cmake/lazyfuse)
