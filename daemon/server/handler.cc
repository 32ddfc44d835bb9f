// MakeErrorReply (declared in server/handler.h).
#include "server/handler.h"

#include "cxlpool/proto/codec.h"

namespace cxlpool {

Reply MakeErrorReply(const Status& status) {
  Reply r;
  r.type = proto::MSG_ERROR_REPLY;
  // An OK status here is a caller bug; still send a well-formed error.
  r.payload = wire::EncodeErrorPayload(
      status.ok() ? Status(Code::kInternal, "error reply built from an OK status") : status);
  return r;
}

}  // namespace cxlpool
