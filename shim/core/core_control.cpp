// The core's own threads (core/core.h): the control socket that answers sleep, wake and status
// (core/control.h), and the compute slices of [compute] (node/compute_share.h) with what they
// need of the program: its launch gate, its queued work drained, the GPU it runs on.
#include "core/core.h"
#include "placement/migration.h"
#include "base/scoped_context.h"

namespace allocshim {

bool Core::start_control() {
  if (budget_.migration().active())
    control_.start(sleeper_, budget_.node(), policy().budget.idle_sleep_ms);
  if (policy().compute.enabled && compute_.start(policy().compute)) {
    slicing_.store(true, std::memory_order_relaxed);
    // Slices hold the program's work at the launch gate, which submissions pass only while watched.
    g_submissions_watched.store(true, std::memory_order_relaxed);
  }
  return control_.running() || compute_.running();
}

void Core::stop_control() {
  control_.stop();
  compute_.stop();
  slicing_.store(false, std::memory_order_relaxed);
  sleeper_.let_go();
}

ComputeShare::Process Core::slice_hooks() {
  ComputeShare::Process p;
  p.gate = &budget_.migration().gate();
  p.drain = [this] { drain_work(); };
  p.syncing = [this] { return syncing_.load(std::memory_order_relaxed) > 0; };
  p.device = [this](node::Uuid* uuid) { return slice_device(uuid); };
  return p;
}

// Waits for every device's queued work in the primary contexts the program has: its submissions
// are held at the gate meanwhile, so this ends once what it queued before has run.
void Core::drain_work() {
  // Allowed while another thread of the program captures a graph (which queues nothing to run).
  if (driver_.thread_relax_capture) driver_.thread_relax_capture();
  int count = 0;
  if (driver_.device_get_count(&count) != res::ok) return;
  for (int d = 0; d < count && d < static_cast<int>(kMaxDevices); ++d) {
    int active = 0;
    Context ctx = nullptr;
    if (driver_.primary_ctx_active(d, &active) != res::ok || !active) continue;
    if (driver_.primary_ctx_retain(&ctx, d) != res::ok) continue;
    {
      ScopedContext scope(driver_, ctx);
      driver_.ctx_synchronize();
    }
    driver_.primary_ctx_release(d);
  }
}

// The GPU of the first primary context the program made active (a process that uses several takes
// slices of that one).
bool Core::slice_device(node::Uuid* uuid) {
  int count = 0;
  if (driver_.device_get_count(&count) != res::ok) return false;
  for (int d = 0; d < count && d < static_cast<int>(kMaxDevices); ++d) {
    int active = 0;
    if (driver_.primary_ctx_active(d, &active) == res::ok && active)
      return driver_.device_get_uuid(uuid->bytes, d) == res::ok;
  }
  return false;
}

}  // namespace allocshim
