# cmake --install: one static archive that holds lazyfuse and what it links statically (abseil,
# OpenBLAS), SLEEF and the CPU JIT's library beside it, the headers under include/lazyfuse (and
# abseil's, which lazyfuse's own include), the CLI, and a package config that names nothing of
# this machine: an outside project does find_package(lazyfuse CONFIG REQUIRED) and links
# lazyfuse::lazyfuse, wherever the prefix was copied, with no development package of the
# libraries lazyfuse linked statically.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The archive: lazyfuse's libraries, every abseil archive beside the ones it links (the linker
# takes only what is used), and OpenBLAS, merged by ar's MRI script.
get_target_property(LAZYFUSE_ABSL_ARCHIVE absl::strings LOCATION)
get_filename_component(LAZYFUSE_ABSL_DIR "${LAZYFUSE_ABSL_ARCHIVE}" DIRECTORY)
file(GLOB LAZYFUSE_ABSL_ARCHIVES "${LAZYFUSE_ABSL_DIR}/libabsl_*.a")
set(LAZYFUSE_BUNDLE ${PROJECT_BINARY_DIR}/package/liblazyfuse.a)
set(LAZYFUSE_BUNDLED_LIBRARIES
    $<TARGET_FILE:lazyfuse_frontend> $<TARGET_FILE:lazyfuse_runtime>
    $<TARGET_FILE:lazyfuse_codegen> $<TARGET_FILE:lazyfuse_ir> ${LAZYFUSE_ABSL_ARCHIVES}
    ${OPENBLAS_STATIC})
add_custom_command(
  OUTPUT ${LAZYFUSE_BUNDLE}
  COMMAND ${CMAKE_COMMAND} -DAR=${CMAKE_AR} -DOUT=${LAZYFUSE_BUNDLE}
          "-DLIBRARIES=$<JOIN:${LAZYFUSE_BUNDLED_LIBRARIES},|>"
          -P ${PROJECT_SOURCE_DIR}/cmake/MergeArchives.cmake
  DEPENDS lazyfuse_frontend lazyfuse_runtime lazyfuse_codegen lazyfuse_ir
          ${PROJECT_SOURCE_DIR}/cmake/MergeArchives.cmake
  COMMENT "Merging lazyfuse, abseil and OpenBLAS into one archive for the package"
  VERBATIM)
add_custom_target(lazyfuse_package_archive ALL DEPENDS ${LAZYFUSE_BUNDLE})
install(FILES ${LAZYFUSE_BUNDLE} DESTINATION lib)
install(FILES ${PROJECT_BINARY_DIR}/lib/libsleef.so.3 ${PROJECT_BINARY_DIR}/lib/libgloo.so.0
        DESTINATION lib)

install(TARGETS lazyfuse_cli walkthrough RUNTIME DESTINATION bin)
foreach(layer ir codegen runtime frontend)
  install(DIRECTORY ${layer}/ DESTINATION include/lazyfuse/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.def" PATTERN "*.inc")
endforeach()
install(FILES include/lazyfuse/lazyfuse.h DESTINATION include/lazyfuse)
# lazyfuse's headers include abseil's (a Shape is an absl::InlinedVector): the headers of the
# abseil it was built with go with it.
find_path(LAZYFUSE_ABSL_INCLUDE_DIR absl/base/config.h REQUIRED)
install(DIRECTORY ${LAZYFUSE_ABSL_INCLUDE_DIR}/absl DESTINATION include
        FILES_MATCHING PATTERN "*.h" PATTERN "*.inc")

write_basic_package_version_file(${PROJECT_BINARY_DIR}/lazyfuseConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES cmake/lazyfuseConfig.cmake ${PROJECT_BINARY_DIR}/lazyfuseConfigVersion.cmake
        DESTINATION lib/cmake/lazyfuse)
