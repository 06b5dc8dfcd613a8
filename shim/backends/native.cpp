#include "backends/native.h"

namespace allocshim {
namespace {

class NativeBackend final : public Backend {
 public:
  NativeBackend(std::string name, const Driver& driver)
      : Backend(std::move(name), BackendKind::native, driver) {}

 private:
  Result do_allocate(const AllocRequest& req, FreeSync, DevPtr* out, std::uint64_t*) override {
    const Driver& d = driver();
    switch (req.api) {
      case Api::pitch:
        return d.mem_alloc_pitch(out, req.pitch_out, req.pitch_width, req.pitch_height,
                                 req.pitch_element);
      case Api::managed: return d.mem_alloc_managed(out, req.size, req.flags);
      case Api::async:
        return req.pool ? d.mem_alloc_from_pool_async(out, req.size, req.pool, req.stream)
                        : d.mem_alloc_async(out, req.size, req.stream);
      case Api::alloc:
      case Api::host:
      case Api::create: break;
    }
    return d.mem_alloc(out, req.size);
  }

  // The free call the program made is the one forwarded: cuMemFree synchronizes by itself, and
  // cuMemFreeAsync keeps its stream ordering. free_sync does not apply to native memory.
  Result do_deallocate(DevPtr ptr, const Block&, const FreeRequest& req) override {
    return req.async ? driver().mem_free_async(ptr, req.stream) : driver().mem_free(ptr);
  }
};

}  // namespace

std::unique_ptr<Backend> make_native_backend(std::string name, const Driver& driver) {
  return std::make_unique<NativeBackend>(std::move(name), driver);
}

}  // namespace allocshim
