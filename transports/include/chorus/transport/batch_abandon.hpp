#pragma once

// For a Comm's operation methods, which may be called inside a batch (begin_group ...
// end_group): when one throws, core never calls end_group, so the open batch is dropped
// (nothing of it has started yet) and the communicator is usable again. Comm::abandon_batch()
// does the dropping (a no-op outside a batch); construct one of these first in each method.

#include <exception>

namespace chorus::transport {

template <class Comm>
class BatchAbandon {
 public:
  explicit BatchAbandon(Comm& comm) noexcept : comm_(&comm) {}
  ~BatchAbandon() {
    if (std::uncaught_exceptions() > exceptions_) {
      comm_->abandon_batch();
    }
  }
  BatchAbandon(const BatchAbandon&) = delete;
  BatchAbandon& operator=(const BatchAbandon&) = delete;

 private:
  Comm* comm_;
  int exceptions_ = std::uncaught_exceptions();
};

}  // namespace chorus::transport
