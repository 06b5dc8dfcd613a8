// Streams and events. Plain entry points read a null stream as the legacy stream, _ptsz ones as the
// calling thread's per-thread stream.
#include "symbols.h"

using namespace fakecuda;

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* stream, unsigned int flags) {
  FAKECUDA_ENTER(cuStreamCreate);
  return hand_out<allocshim::Stream>(
      stream, [&](allocshim::Stream* s) { return drv().stream_create(s, flags); });
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                                            int priority) {
  FAKECUDA_ENTER(cuStreamCreateWithPriority);
  return hand_out<allocshim::Stream>(stream, [&](allocshim::Stream* s) {
    return drv().stream_create_with_priority(s, flags, priority);
  });
}

FAKECUDA_FORWARD_TWINS(cuStreamDestroy, cuStreamDestroy_v2, (CUstream stream),
                       drv().stream_destroy(stream), stream)

FAKECUDA_STREAM_PAIR(cuStreamSynchronize, (CUstream stream), drv().stream_synchronize(stream_))

FAKECUDA_STREAM_PAIR(cuStreamQuery, (CUstream stream), drv().stream_query(stream_))

// The fake has no graphs: nothing is ever being captured.
FAKECUDA_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream stream,
                                                     CUstreamCaptureStatus* status) {
  FAKECUDA_ENTER(cuStreamIsCapturing);
  bool capturing = false;
  const CUresult r = static_cast<CUresult>(drv().stream_is_capturing(legacy(stream), &capturing));
  if (status) *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return r;
}

// The shim's own threads relax their capture mode; with no graphs there is nothing to relax.
FAKECUDA_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKECUDA_ENTER(cuThreadExchangeStreamCaptureMode);
  return mode != nullptr ? static_cast<CUresult>(drv().thread_relax_capture())
                         : CUDA_ERROR_INVALID_VALUE;
}

FAKECUDA_STREAM_PAIR(cuStreamWaitEvent, (CUstream stream, CUevent event, unsigned int flags),
                     drv().stream_wait_event(stream_, event, flags))

FAKECUDA_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* event, unsigned int flags) {
  FAKECUDA_ENTER(cuEventCreate);
  return hand_out<allocshim::Event>(
      event, [&](allocshim::Event* e) { return drv().event_create(e, flags); });
}

FAKECUDA_STREAM_PAIR(cuEventRecord, (CUevent event, CUstream stream),
                     drv().event_record(event, stream_))

FAKECUDA_FORWARD(cuEventQuery, (CUevent event), drv().event_query(event))

FAKECUDA_FORWARD(cuEventSynchronize, (CUevent event), drv().event_synchronize(event))

FAKECUDA_FORWARD(cuEventElapsedTime, (float* ms, CUevent start, CUevent end),
                 drv().event_elapsed_time(ms, start, end))

FAKECUDA_FORWARD_TWINS(cuEventDestroy, cuEventDestroy_v2, (CUevent event),
                       drv().event_destroy(event))
