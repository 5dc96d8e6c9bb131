# cmake --install: the static libraries, the headers, SLEEF beside them, and a package config
# so that an outside project does find_package(lazyfuse CONFIG REQUIRED).
