// High-water marks that several threads raise without a lock (the budget's peaks, the statistics'
// peak live and peak reserved bytes, a shared budget's peak lease).
#pragma once

#include <atomic>
#include <type_traits>

namespace allocshim {

// Raises `peak` to `value` if it is higher; never lowers it. Relaxed: a peak orders nothing else.
template <class T>
inline void raise_peak(std::atomic<T>& peak, std::type_identity_t<T> value) {
  T seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {}
}

}  // namespace allocshim
