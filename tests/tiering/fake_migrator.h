// What the tiering tests' fake migrators report: every page of a move on
// its target, and a census that found the range's pages on no node.
#pragma once

#include <cstdint>

#include "tiering/migrator.h"

namespace cxlpool::tiering::fakes {

inline MoveReport CompleteMove(const MoveRequest& req) {
  MoveReport r;
  r.target_node = req.target_node;
  r.bytes = req.length;
  r.after.pages = req.length / req.page_size;
  r.after.on_node[req.target_node] = r.after.pages;
  r.move_ns = 1'000'000;
  return r;
}

inline PageCount PagesNowhere(uint64_t length, uint64_t page) {
  PageCount c;
  c.pages = length / page;
  return c;
}

}  // namespace cxlpool::tiering::fakes
