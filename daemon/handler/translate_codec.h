// The two steps every translation shares: a typed message to a reply frame,
// and a request's payload to a typed message. For translate*.cc only.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cxlpool/proto/codec.h"
#include "server/handler.h"

namespace cxlpool {

template <typename M>
Reply EncodeAsReply(const M& msg, std::vector<int> fds = {}) {
  auto payload = wire::Encode(msg);
  if (!payload.ok()) return MakeErrorReply(payload.status());
  Reply r;
  r.type = wire::TypeOf<M>();
  r.payload = std::move(*payload);
  r.fds = std::move(fds);
  return r;
}

template <typename M>
Status DecodePayload(const Request& req, M* out) {
  Status st = wire::Decode(req.payload, out);
  if (!st.ok()) return Status(st.code(), wire::MsgTypeName(req.type) + ": " + st.message());
  return Status::Ok();
}

}  // namespace cxlpool
