# lazyfuse's package config: find_package(lazyfuse CONFIG REQUIRED), then link lazyfuse::lazyfuse
# and #include <lazyfuse/lazyfuse.h>. Every path is found from where this file lies, so the
# installed prefix works wherever it is copied; abseil and OpenBLAS are inside liblazyfuse.a.
get_filename_component(_lazyfuse_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(OpenMP)
find_dependency(Threads)
if(NOT TARGET lazyfuse::lazyfuse)
  add_library(lazyfuse::lazyfuse STATIC IMPORTED)
  set_target_properties(lazyfuse::lazyfuse PROPERTIES
    IMPORTED_LOCATION "${_lazyfuse_prefix}/lib/liblazyfuse.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_lazyfuse_prefix}/include"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES
      "OpenMP::OpenMP_CXX;Threads::Threads;${CMAKE_DL_LIBS};${_lazyfuse_prefix}/lib/libsleef.so.3;${_lazyfuse_prefix}/lib/libgloo.so.0")
endif()
unset(_lazyfuse_prefix)
