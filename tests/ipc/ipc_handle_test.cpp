// The shim's 64-byte handle: round trip, and every way a handle can be damaged or foreign.
#include "ipc/handle.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "fake_driver.h"

namespace allocshim::ipc {
namespace {

HandleFields sample() {
  HandleFields f;
  f.pid = 4242;
  f.nonce = 0x0123456789abcdefull;
  f.export_id = 17;
  f.offset = 3 * 1024 * 1024 + 256;
  f.size = 1000;
  f.secret = 0x8badf00ddeadbeefull;
  f.kind = Kind::vmm;
  return f;
}

TEST(IpcHandle, RoundTripsEveryField) {
  for (Kind kind : {Kind::vmm, Kind::pool}) {
    HandleFields f = sample();
    f.kind = kind;
    IpcHandle h;
    encode(f, &h);
    HandleFields g;
    ASSERT_EQ(decode(h, &g), Decoded::ours);
    EXPECT_EQ(g.pid, f.pid);
    EXPECT_EQ(g.nonce, f.nonce);
    EXPECT_EQ(g.export_id, f.export_id);
    EXPECT_EQ(g.offset, f.offset);
    EXPECT_EQ(g.size, f.size);
    EXPECT_EQ(g.secret, f.secret);
    EXPECT_EQ(g.kind, kind);
    EXPECT_TRUE(has_magic(h));
  }
}

TEST(IpcHandle, EveryFlippedBitIsDetected) {
  IpcHandle good;
  encode(sample(), &good);
  for (std::size_t byte = 0; byte < kIpcHandleBytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      IpcHandle h = good;
      h.bytes[byte] ^= static_cast<unsigned char>(1u << bit);
      // A damaged magic makes it someone else's handle (the driver refuses it); anything else is
      // a shim handle that must be refused, never a different valid one.
      const Decoded d = decode(h, nullptr);
      EXPECT_NE(d, Decoded::ours) << "byte " << byte << " bit " << bit;
      EXPECT_EQ(d, byte < 8 ? Decoded::foreign : Decoded::corrupt) << "byte " << byte;
    }
  }
}

TEST(IpcHandle, TruncatedHandlesAreRefused) {
  IpcHandle good;
  encode(sample(), &good);
  // A handle cut short in transit arrives zero-filled (or garbage-filled) past the cut.
  for (std::size_t keep = 8; keep < kIpcHandleBytes; ++keep) {
    IpcHandle h = good;
    std::memset(h.bytes + keep, 0, kIpcHandleBytes - keep);
    EXPECT_EQ(decode(h, nullptr), Decoded::corrupt) << "kept " << keep;
    std::memset(h.bytes + keep, 0xff, kIpcHandleBytes - keep);
    EXPECT_EQ(decode(h, nullptr), Decoded::corrupt) << "kept " << keep;
  }
}

TEST(IpcHandle, RandomBytesAndNativeHandlesAreForeign) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    IpcHandle h;
    for (auto& b : h.bytes) b = static_cast<unsigned char>(rng());
    EXPECT_EQ(decode(h, nullptr), Decoded::foreign);
  }
  IpcHandle zero{};
  EXPECT_EQ(decode(zero, nullptr), Decoded::foreign);
  // The fake driver's own handle of a cuMemAlloc allocation.
  fake::FakeDriver fake;
  DevPtr p = 0;
  ASSERT_EQ(fake.driver().mem_alloc(&p, 4096), res::ok);
  IpcHandle native;
  ASSERT_EQ(fake.driver().ipc_get_mem_handle(&native, p), res::ok);
  EXPECT_EQ(decode(native, nullptr), Decoded::foreign);
  fake.driver().mem_free(p);
}

TEST(IpcHandle, MagicWithImpossibleFieldsIsCorrupt) {
  // Well-formed checksums over fields the exporter never issues.
  HandleFields f = sample();
  f.pid = 0;
  IpcHandle h;
  encode(f, &h);
  EXPECT_EQ(decode(h, nullptr), Decoded::corrupt);
  f = sample();
  f.export_id = 0;
  encode(f, &h);
  EXPECT_EQ(decode(h, nullptr), Decoded::corrupt);
  f = sample();
  f.size = 0;
  encode(f, &h);
  EXPECT_EQ(decode(h, nullptr), Decoded::corrupt);
  f = sample();
  f.offset = ~0ull - 10;
  encode(f, &h);
  EXPECT_EQ(decode(h, nullptr), Decoded::corrupt);
}

TEST(IpcHandle, TheFakeDriverRefusesAShimHandleAsNativeIpcWould) {
  // What an importer without the shim gets: the driver's invalid-handle answer.
  fake::FakeDriver fake;
  IpcHandle h;
  encode(sample(), &h);
  DevPtr p = 0;
  EXPECT_EQ(fake.driver().ipc_open_mem_handle(&p, h, 0), res::invalid_value);
}

}  // namespace
}  // namespace allocshim::ipc
