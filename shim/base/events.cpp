// The installed event observer (see events.h).
#include "base/events.h"

namespace allocshim::detail {

std::atomic<EventSink*> g_event_sink{nullptr};

}  // namespace allocshim::detail
