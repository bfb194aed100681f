// Registered memory: ucp_mem_map / unmap (under the worker lock, as the context is not
// shared between threads), and the handle lookup that posts of kMemhMinBytes or more use.
#include <string>

#include "comm/ucx/transport_impl.h"

namespace afd::comm::ucx {

Result<MemoryRegion> UcxTransportImpl::register_memory(void* base, size_t size) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = base;
  p.length = size;
  ucp_mem_h memh = nullptr;
  WorkerLock::Guard g(lock_);
  ucs_status_t st = ucp_mem_map(context_, &p, &memh);
  if (st != UCS_OK) return resource_exhausted(ucs_error("ucp_mem_map", st) + " (" + std::to_string(size) + " bytes)");
  MemoryRegion r{base, size, reinterpret_cast<uint64_t>(memh)};
  regions_.add(base, size, r.handle, memh);
  return r;
}

Status UcxTransportImpl::deregister_memory(const MemoryRegion& region) {
  WorkerLock::Guard g(lock_);
  void* memh = regions_.remove(region.base, region.handle);
  if (memh == nullptr) return not_found("ucx deregister_memory: region was not registered here");
  ucp_mem_unmap(context_, static_cast<ucp_mem_h>(memh));
  return Status();
}

void UcxTransportImpl::add_memh(ucp_request_param_t* param, const void* buf, size_t len) {
  if (len < kMemhMinBytes) return;
  if (void* memh = regions_.find(buf, len)) {
    param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param->memh = static_cast<ucp_mem_h>(memh);
  }
}

}  // namespace afd::comm::ucx
