// The installed event observer (see events.h).
#include "core/events.h"

namespace allocshim::detail {

std::atomic<EventSink*> g_event_sink{nullptr};

}  // namespace allocshim::detail
