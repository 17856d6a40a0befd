# Cross build of the host code for aarch64 (DGX Spark's Grace CPU) with Debian's
# cross compiler (g++-aarch64-linux-gnu) and the arm64 packages of the
# dependencies installed side by side (multiarch, scripts/deps_aarch64.sh).
# Header-only dependencies (nlohmann-json, cereal, toml++, Boost's headers)
# are found in /usr/include, which Debian's cross compilers search as well.
# Tests run under qemu-user (scripts/test_aarch64.sh; docs/AARCH64.md).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and CMake package files only from the arm64 folders; programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Never the host's (amd64) libraries, whichever module looks (pkg-config included).
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Programs run with the arm64 glibc of the multiarch packages (libc6:arm64, the
# one libfmt9:arm64 and the others link against), not the cross toolchain's copy
# in /usr/aarch64-linux-gnu: mixing that loader with the multiarch libc.so.6
# (2.36-8cross1 against 2.36-9+deb12u*) made fork() hang after a thread had run.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
