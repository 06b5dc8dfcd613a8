// The IPC wire under arbitrary bytes: shim handles (64 bytes a program may pass anywhere) and
// broker messages as a peer may send them, with any number of file descriptors attached. Decoding
// must never crash, accept only what encoding produces, and never leak a descriptor.
// fuzz_wire_main.cpp makes it a libFuzzer target (ALLOCSHIM_FUZZ=ON, clang); ipc_wire_fuzz_test.cpp
// runs it as a plain test over seeds and mutations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::ipc::fuzz {

// Empty when the input was handled correctly; otherwise what went wrong.
std::string check_input(const std::uint8_t* data, std::size_t size);

}  // namespace allocshim::ipc::fuzz
