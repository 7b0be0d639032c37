#include "cache/page_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/bf16.h"

namespace fpa::cache {
namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Where a page's arrays lie (base not yet known); k and v come first and only with host storage.
PageLayout layout_for(const CacheShape& shape, bool host_storage) {
  const size_t slots = static_cast<size_t>(shape.page_slots);
  const size_t kv =
      host_storage ? align_up(slots * static_cast<size_t>(shape.head_dim) * shape.kv_bytes) : 0;
  const size_t scalar = align_up(slots * 4);
  PageLayout l;
  l.v = kv;
  l.lvl = 2 * kv;
  l.m = l.lvl + scalar;
  l.acc = l.m + scalar;
  l.pos = l.acc + scalar;
  l.stride = l.pos + scalar;
  l.kv_bytes = host_storage ? shape.kv_bytes : 0;
  return l;
}

}  // namespace

int64_t PageTable::bytes_per_key(const CacheShape& shape, bool host_storage) {
  const int64_t scalars = host_storage ? 4 : 3;  // lvl, m, pos (+ acc)
  return 2 * static_cast<int64_t>(shape.head_dim) * shape.kv_bytes + scalars * 4;
}

absl::StatusOr<std::unique_ptr<PageTable>> PageTable::create(const CacheShape& shape,
                                                             int64_t num_pages, bool host_storage) {
  const size_t bytes = static_cast<size_t>(num_pages) * layout_for(shape, host_storage).stride;
  // A stream's pages lie apart in the pool, so decode reads it page by scattered page and a TLB
  // miss costs about as much as the page's reads (bench/RESULTS.md, "Decode attention kernel").
  HugeBuffer base = allocate_huge(bytes);
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for ", num_pages, " KV cache pages"));
  }
  return std::unique_ptr<PageTable>(new PageTable(shape, num_pages, host_storage, std::move(base)));
}

PageTable::PageTable(const CacheShape& shape, int64_t num_pages, bool host_storage, HugeBuffer base)
    : slots_(shape.page_slots),
      head_dim_(shape.head_dim),
      num_pages_(num_pages),
      host_storage_(host_storage),
      kv_bytes_(shape.kv_bytes),
      base_(std::move(base)),
      layout_(layout_for(shape, host_storage)),
      info_(static_cast<size_t>(num_pages)),
      next_free_(static_cast<size_t>(num_pages * shape.page_slots), -1),
      where_(static_cast<size_t>(num_pages * shape.page_slots), -1),
      ledger_(num_pages, bytes_per_key(shape, host_storage), shape.n_layers) {
  layout_.base = base_.get();
}

std::byte* PageTable::kv_row(int32_t gslot, bool value) const {
  const size_t row = static_cast<size_t>(head_dim_) * kv_bytes_;
  return base_.get() + static_cast<size_t>(gslot / slots_) * layout_.stride +
         (value ? layout_.v : 0) + static_cast<size_t>(gslot % slots_) * row;
}

void PageTable::prefetch_slot(int32_t gslot) const {
  const PageView v = view(gslot / slots_);
  const int32_t s = gslot % slots_;
  __builtin_prefetch(v.pos + s);
  __builtin_prefetch(v.lvl + s);
  __builtin_prefetch(v.m + s);
  __builtin_prefetch(where_.data() + gslot);
}

void PageTable::prefetch_page(int32_t page) const {
  const PageView v = view(page);
  __builtin_prefetch(info_.data() + page);
  __builtin_prefetch(next_free_.data() + static_cast<size_t>(page) * slots_);
  for (const void* field : {static_cast<const void*>(v.pos), static_cast<const void*>(v.lvl),
                            static_cast<const void*>(v.m), static_cast<const void*>(v.acc)}) {
    __builtin_prefetch(field);
  }
}

void PageTable::adopt(StreamPages& stream, int32_t page) {
  PageInfo& info = info_[static_cast<size_t>(page)];
  const PageView v = view(page);
  const int32_t first = page * slots_;
  for (int32_t s = 0; s < slots_; ++s) {
    v.pos[s] = -1;
    v.acc[s] = 0.0f;
    next_free_[static_cast<size_t>(first + s)] = s + 1 < slots_ ? s + 1 : -1;
    where_[static_cast<size_t>(first + s)] = -1;
  }
  info = PageInfo{0, 0, static_cast<int32_t>(stream.pages.size()),
                  static_cast<int32_t>(stream.nonfull.size())};
  stream.pages.push_back(page);
  stream.nonfull.push_back(page);
}

void PageTable::drop(StreamPages& stream, int32_t page) {
  PageInfo& info = info_[static_cast<size_t>(page)];
  auto remove = [&](std::vector<int32_t>& list, int32_t PageInfo::*index) {
    const int32_t i = info.*index;
    if (i < 0) return;
    const int32_t last = list.back();
    list[static_cast<size_t>(i)] = last;
    info_[static_cast<size_t>(last)].*index = i;
    list.pop_back();
    info.*index = -1;
  };
  remove(stream.pages, &PageInfo::list_index);
  remove(stream.nonfull, &PageInfo::nonfull_index);
}

int32_t PageTable::claim(StreamPages& stream, int32_t page) {
  PageInfo& info = info_[static_cast<size_t>(page)];
  const int32_t gslot = page * slots_ + info.free_head;
  info.free_head = next_free_[static_cast<size_t>(gslot)];
  ++info.live;
  ++stream.live;
  if (info.live == slots_) {
    const int32_t i = info.nonfull_index;
    const int32_t last = stream.nonfull.back();
    stream.nonfull[static_cast<size_t>(i)] = last;
    info_[static_cast<size_t>(last)].nonfull_index = i;
    stream.nonfull.pop_back();
    info.nonfull_index = -1;
  }
  return gslot;
}

bool PageTable::unclaim(StreamPages& stream, int32_t gslot) {
  const int32_t page = gslot / slots_;
  const int32_t slot = gslot % slots_;
  PageInfo& info = info_[static_cast<size_t>(page)];
  view(page).pos[slot] = -1;
  where_[static_cast<size_t>(gslot)] = -1;
  next_free_[static_cast<size_t>(gslot)] = info.free_head;
  info.free_head = slot;
  if (info.live == slots_) {
    info.nonfull_index = static_cast<int32_t>(stream.nonfull.size());
    stream.nonfull.push_back(page);
  }
  --info.live;
  --stream.live;
  return info.live == 0;
}

absl::StatusOr<int32_t> PageTable::take_slot(StreamPages& stream, int layer,
                                             int64_t full_keys_delta, int64_t* reservation) {
  LedgerDelta with = stream.unsettled;
  with += {.live = 1, .full_keys = full_keys_delta};
  if (!stream.nonfull.empty()) {
    stream.unsettled = with;
    return claim(stream, stream.nonfull.back());
  }
  const int32_t near = stream.pages.empty() ? -1 : stream.pages.back() + 1;
  const std::optional<int32_t> page = ledger_.take_page(with, reservation, near, layer);
  if (!page) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache pool exhausted: all ", num_pages_,
                                                     " pages of ", slots_,
                                                     " slots are in use or reserved"));
  }
  stream.unsettled = {};
  adopt(stream, *page);
  return claim(stream, *page);
}

void PageTable::write_slot(int32_t gslot, int32_t pos, float lvl, float m, const float* k,
                           const float* v) {
  const PageView view_ = view(gslot / slots_);
  const int32_t s = gslot % slots_;
  view_.pos[s] = pos;
  view_.lvl[s] = lvl;
  view_.m[s] = m;
  view_.acc[s] = 0.0f;
  if (!host_storage_) return;
  const size_t d = static_cast<size_t>(head_dim_);
  const size_t at = static_cast<size_t>(s) * d;
  if (kv_bytes_ == 4) {
    std::memcpy(view_.k + at, k, d * sizeof(float));
    std::memcpy(view_.v + at, v, d * sizeof(float));
  } else {
    to_bf16(k, d, view_.k16 + at);
    to_bf16(v, d, view_.v16 + at);
  }
}

void PageTable::free_slots(StreamPages& stream, std::span<const int32_t> gslots, bool evicted) {
  if (gslots.empty()) return;
  std::vector<int32_t> emptied;
  for (int32_t gslot : gslots) {
    if (unclaim(stream, gslot)) emptied.push_back(gslot / slots_);
  }
  for (int32_t page : emptied) drop(stream, page);
  const auto n = static_cast<int64_t>(gslots.size());
  stream.unsettled += {.live = -n, .evicted = evicted ? n : 0};
  if (!emptied.empty()) return_pages(stream, emptied);
}

void PageTable::release(StreamPages& stream, int64_t full_keys) {
  stream.unsettled += {.live = -stream.live, .full_keys = -full_keys};
  return_pages(stream, stream.pages);
  for (int32_t page : stream.pages) info_[static_cast<size_t>(page)] = PageInfo{};
  stream = StreamPages{};
}

void PageTable::return_pages(StreamPages& stream, std::span<const int32_t> pages) {
  ledger_.apply(stream.unsettled, pages);
  stream.unsettled = {};
}

absl::StatusOr<int32_t> PageTable::clone_slot(StreamPages& stream, int32_t from) {
  absl::StatusOr<int32_t> to = take_slot(stream, ledger_.region_of(from / slots_), 0, nullptr);
  if (to.ok()) copy_slot(from, *to);
  return to;
}

void PageTable::copy_slot(int32_t from, int32_t to) {
  const PageView a = view(from / slots_);
  const PageView b = view(to / slots_);
  const int32_t i = from % slots_;
  const int32_t j = to % slots_;
  b.pos[j] = a.pos[i];
  b.lvl[j] = a.lvl[i];
  b.m[j] = a.m[i];
  b.acc[j] = a.acc[i];
  if (!host_storage_) return;
  const size_t row = static_cast<size_t>(head_dim_) * kv_bytes_;
  std::memcpy(kv_row(to, false), kv_row(from, false), row);
  std::memcpy(kv_row(to, true), kv_row(from, true), row);
}

int PageTable::compact(StreamPages& stream,
                       const std::function<void(int32_t from, int32_t to)>& moved) {
  const auto keep = static_cast<size_t>((stream.live + slots_ - 1) / slots_);
  if (stream.pages.size() <= keep) return 0;
  // The fullest pages stay, so the fewest slots move.
  std::vector<int32_t> order = stream.pages;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return info_[static_cast<size_t>(a)].live > info_[static_cast<size_t>(b)].live;
  });
  const std::span<const int32_t> targets(order.data(), keep);
  const std::span<const int32_t> sources(order.data() + keep, order.size() - keep);
  size_t t = 0;
  for (int32_t page : sources) {
    const PageView v = view(page);
    for (int32_t s = 0; s < slots_; ++s) {
      if (v.pos[s] < 0) continue;
      while (info_[static_cast<size_t>(targets[t])].live == slots_) ++t;
      const int32_t from = page * slots_ + s;
      const int32_t to = claim(stream, targets[t]);
      copy_slot(from, to);
      moved(from, to);
      unclaim(stream, from);
    }
  }
  for (int32_t page : sources) drop(stream, page);
  return_pages(stream, sources);
  return static_cast<int>(sources.size());
}

}  // namespace fpa::cache
