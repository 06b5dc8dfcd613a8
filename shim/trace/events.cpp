// The record layout of each event (docs/trace-format.md): what the core's calls append.
#include <cstring>

#include "trace/recorder_impl.h"

namespace allocshim::trace {

void Recorder::on_alloc(DevPtr ptr, std::size_t size, int device, int backend, Api api,
                        std::uint64_t ns, std::uint32_t flags) {
  Impl& im = *impl_;
  ThreadState& ts = im.thread_state();
  std::uint32_t stack = 0;
  if (im.config.sample <= 1 || ++ts.sample_count % im.config.sample == 0)
    stack = im.stack_id(ts, __builtin_return_address(0));
  else
    flags |= kAllocUnsampled;
  im.emit(Tag::alloc, [&](unsigned char* p, ThreadState& t) {
    p = put_varint(p, static_cast<std::uint64_t>(device));
    p = put_varint(p, size);
    p = put_varint(p, zigzag(static_cast<std::int64_t>(ptr - t.last_addr)));
    t.last_addr = ptr;
    p = put_varint(p, static_cast<std::uint64_t>(backend));
    p = put_varint(p, static_cast<std::uint64_t>(api) | (static_cast<std::uint64_t>(flags) << 3));
    p = put_varint(p, ns);
    return put_varint(p, stack);
  });
}

void Recorder::on_free(DevPtr ptr, std::size_t size, int device, int backend, std::uint64_t ns,
                       std::uint32_t flags) {
  impl_->emit(
      Tag::free,
      [&](unsigned char* p, ThreadState& t) {
        p = put_varint(p, static_cast<std::uint64_t>(device));
        p = put_varint(p, size);
        p = put_varint(p, zigzag(static_cast<std::int64_t>(ptr - t.last_addr)));
        t.last_addr = ptr;
        p = put_varint(p, static_cast<std::uint64_t>(backend));
        p = put_varint(p, ns);
        return put_varint(p, flags);
      },
      ns);  // stamped when the free began: before the block can be reused by another thread
}

void Recorder::on_alloc_failed(std::size_t size, int device, int backend, Api api, Result result,
                               std::uint64_t ns) {
  Impl& im = *impl_;
  const std::uint32_t stack = im.stack_id(im.thread_state(), __builtin_return_address(0));
  im.emit(Tag::alloc_fail, [&](unsigned char* p, ThreadState&) {
    p = put_varint(p, static_cast<std::uint64_t>(device));
    p = put_varint(p, size);
    p = put_varint(p, static_cast<std::uint64_t>(backend));
    p = put_varint(p, static_cast<std::uint64_t>(api));
    p = put_varint(p, static_cast<std::uint64_t>(result));
    p = put_varint(p, ns);
    return put_varint(p, stack);
  });
}

void Recorder::on_migrate(DevPtr ptr, std::size_t size, int device, int from_backend,
                          int to_backend, std::uint64_t ns) {
  impl_->emit(Tag::migrate, [&](unsigned char* p, ThreadState& t) {
    p = put_varint(p, static_cast<std::uint64_t>(device));
    p = put_varint(p, size);
    p = put_varint(p, zigzag(static_cast<std::int64_t>(ptr - t.last_addr)));
    t.last_addr = ptr;
    p = put_varint(p, static_cast<std::uint64_t>(from_backend));
    p = put_varint(p, static_cast<std::uint64_t>(to_backend));
    return put_varint(p, ns);
  });
}

void Recorder::on_oom(std::size_t size, int device, std::uint64_t budget, std::uint64_t reserved) {
  Impl& im = *impl_;
  const std::uint32_t stack = im.stack_id(im.thread_state(), __builtin_return_address(0));
  im.emit(Tag::oom, [&](unsigned char* p, ThreadState&) {
    p = put_varint(p, static_cast<std::uint64_t>(device));
    p = put_varint(p, size);
    p = put_varint(p, budget);
    p = put_varint(p, reserved);
    return put_varint(p, stack);
  });
}

void Recorder::on_reload(std::string_view source, bool ok) {
  // Rare and variable-length: the source path is cut to fit one record.
  const std::string_view s = source.substr(0, kMaxRecord - 2 * kMaxVarint - 2);
  impl_->emit(Tag::reload, [&](unsigned char* p, ThreadState&) {
    p = put_varint(p, ok ? 1 : 0);
    p = put_varint(p, s.size());
    std::memcpy(p, s.data(), s.size());
    return p + s.size();
  });
}

}  // namespace allocshim::trace
