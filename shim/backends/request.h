// What a request asks of a sub-allocating backend in bytes. Pitched requests (cuMemAllocPitch)
// are served as one block of pitch * height, the pitch rounded up as the driver does, and the pitch
// written back where the program asked for it.
#pragma once

#include <cstddef>

#include "core/backend.h"

namespace allocshim {

// Row pitch alignment the driver uses for cuMemAllocPitch on current GPUs (and the fake).
inline constexpr std::size_t kPitchAlign = 512;

// Bytes to allocate for `req`, or invalid_value where the driver would refuse it (zero bytes; a
// pitched request with an element size other than 4, 8 or 16, a zero extent, or an overflow).
inline Result request_bytes(const AllocRequest& req, std::size_t* bytes) {
  if (req.api != Api::pitch) {
    *bytes = req.size;
    return req.size == 0 ? res::invalid_value : res::ok;
  }
  const unsigned e = req.pitch_element;
  if ((e != 4 && e != 8 && e != 16) || req.pitch_width == 0 || req.pitch_height == 0 ||
      req.pitch_out == nullptr)
    return res::invalid_value;
  const std::size_t pitch = (req.pitch_width + kPitchAlign - 1) / kPitchAlign * kPitchAlign;
  if (pitch < req.pitch_width || req.pitch_height > ~std::size_t{0} / pitch)
    return res::invalid_value;
  *req.pitch_out = pitch;
  *bytes = pitch * req.pitch_height;
  return res::ok;
}

}  // namespace allocshim
