// RegionIndex: the registered memory ranges of one transport, looked up by address.
//
// Each range carries an opaque handle (the transport's ucp_mem_h). Ranges may nest or
// overlap; find() returns the handle of a range that contains [p, p + n) (the one with the
// highest base among those that do), or null. Not thread-safe: the owner serializes calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace afd::comm::ucx {

class RegionIndex {
 public:
  void add(void* base, size_t size, uint64_t id, void* handle);
  // Removes the range added with (base, id) and returns its handle, or null if none.
  void* remove(void* base, uint64_t id);
  void* find(const void* p, size_t n) const;
  // Every handle still held, for teardown; the index is emptied.
  std::vector<void*> take_all();

 private:
  struct Range {
    uintptr_t base;
    size_t size;
    uint64_t id;
    void* handle;
  };
  std::vector<Range> ranges_;  // sorted by base
  size_t max_size_ = 0;        // the largest size ever added: bounds how far back find() looks
};

}  // namespace afd::comm::ucx
