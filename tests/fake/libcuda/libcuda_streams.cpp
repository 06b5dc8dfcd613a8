// Streams and events. Plain entry points read a null stream as the legacy stream, _ptsz ones as the
// calling thread's per-thread stream.
#include "symbols.h"

using namespace fakecuda;

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* stream, unsigned int flags) {
  FAKECUDA_ENTER(cuStreamCreate);
  allocshim::Stream s = nullptr;
  const CUresult r = cu(drv().stream_create(&s, flags));
  if (r == CUDA_SUCCESS) *stream = static_cast<CUstream>(s);
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                                            int priority) {
  FAKECUDA_ENTER(cuStreamCreateWithPriority);
  allocshim::Stream s = nullptr;
  const CUresult r = cu(drv().stream_create_with_priority(&s, flags, priority));
  if (r == CUDA_SUCCESS) *stream = static_cast<CUstream>(s);
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
  FAKECUDA_ENTER(cuStreamDestroy, stream);
  return cu(drv().stream_destroy(stream));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  FAKECUDA_ENTER(cuStreamDestroy_v2, stream);
  return cu(drv().stream_destroy(stream));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
  FAKECUDA_ENTER(cuStreamSynchronize, stream);
  return cu(drv().stream_synchronize(legacy(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream stream) {
  FAKECUDA_ENTER(cuStreamSynchronize_ptsz, stream);
  return cu(drv().stream_synchronize(per_thread(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream stream) {
  FAKECUDA_ENTER(cuStreamQuery, stream);
  return cu(drv().stream_query(legacy(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream stream) {
  FAKECUDA_ENTER(cuStreamQuery_ptsz, stream);
  return cu(drv().stream_query(per_thread(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event,
                                                   unsigned int flags) {
  FAKECUDA_ENTER(cuStreamWaitEvent, stream);
  return cu(drv().stream_wait_event(legacy(stream), event, flags));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream stream, CUevent event,
                                                        unsigned int flags) {
  FAKECUDA_ENTER(cuStreamWaitEvent_ptsz, stream);
  return cu(drv().stream_wait_event(per_thread(stream), event, flags));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* event, unsigned int flags) {
  FAKECUDA_ENTER(cuEventCreate);
  allocshim::Event e = nullptr;
  const CUresult r = cu(drv().event_create(&e, flags));
  if (r == CUDA_SUCCESS) *event = static_cast<CUevent>(e);
  return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
  FAKECUDA_ENTER(cuEventRecord, stream);
  return cu(drv().event_record(event, legacy(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent event, CUstream stream) {
  FAKECUDA_ENTER(cuEventRecord_ptsz, stream);
  return cu(drv().event_record(event, per_thread(stream)));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventQuery(CUevent event) {
  FAKECUDA_ENTER(cuEventQuery);
  return cu(drv().event_query(event));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  FAKECUDA_ENTER(cuEventSynchronize);
  return cu(drv().event_synchronize(event));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent event) {
  FAKECUDA_ENTER(cuEventDestroy);
  return cu(drv().event_destroy(event));
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent event) {
  FAKECUDA_ENTER(cuEventDestroy_v2);
  return cu(drv().event_destroy(event));
}
