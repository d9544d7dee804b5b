// Optimizer updates applied where the table lives (a parameter server): a
// trainer sends the batch's unique keys and their summed gradients, and one
// pass per key updates the row and its slot groups (de_groups.h) in place,
// so slot rows never travel and concurrent trainers' updates add up. A key
// the table lacks starts from its initial row (the InitSpec the lookup drew
// it from, or the row the trainer looked up) and its slots' fills.
//
// The update rules are those of TF's training ops and the Keras optimizers;
// the hyper-parameters (learning rate after schedules, Adam's bias
// correction, ...) are evaluated on the trainer each step and arrive as
// numbers (ApplySpec::hyper, layout per kind below).
#ifndef TFRA_DE_CC_OPS_DE_APPLY_H_
#define TFRA_DE_CC_OPS_DE_APPLY_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_batch.h"
#include "de_eviction.h"
#include "de_groups.h"
#include "de_init.h"
#include "de_table_core.h"

namespace tfra_de {

// Arithmetic type of an update: float for float / half / bfloat16 rows.
template <class V>
using ComputeOf = typename std::conditional<std::is_same<V, double>::value, double, float>::type;

template <class C>
struct UpdateRule {
  ApplySpec::Kind kind;
  C h[ApplySpec::kMaxHyper];
};

// Updates one key's `dim` columns: w (the row), s[k] (slot k's columns, in
// the kind's slot order), g (its summed gradient).
template <class V, class C>
inline void ApplyRow(const UpdateRule<C>& r, int64_t dim, V* w, V* const* s, const V* g) {
  auto ld = [](V x) { return static_cast<C>(x); };
  auto st = [](C x) { return static_cast<V>(x); };
  const C decay = r.h[0];
  if (decay != C(0)) {
    for (int64_t j = 0; j < dim; ++j) w[j] = st(ld(w[j]) - ld(w[j]) * decay);
  }
  const C* h = r.h + 1;
  switch (r.kind) {
    case ApplySpec::kSgd: {  // lr
      for (int64_t j = 0; j < dim; ++j) w[j] = st(ld(w[j]) - h[0] * ld(g[j]));
      break;
    }
    case ApplySpec::kMomentum: {  // lr, momentum, nesterov; a = a * mu + g
      V* a = s[0];
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]), aj = ld(a[j]) * h[1] + gj;
        a[j] = st(aj);
        w[j] = st(h[2] != C(0) ? ld(w[j]) - (gj * h[0] + aj * h[1] * h[0]) : ld(w[j]) - aj * h[0]);
      }
      break;
    }
    case ApplySpec::kKerasMomentum: {  // lr, momentum, nesterov; a = a * mu - lr * g
      V* a = s[0];
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]), aj = ld(a[j]) * h[1] - gj * h[0];
        a[j] = st(aj);
        w[j] = st(h[2] != C(0) ? ld(w[j]) + (aj * h[1] - gj * h[0]) : ld(w[j]) + aj);
      }
      break;
    }
    case ApplySpec::kAdagrad: {  // lr, eps inside the root, eps outside it
      V* a = s[0];
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]), aj = ld(a[j]) + gj * gj;
        a[j] = st(aj);
        w[j] = st(ld(w[j]) - h[0] * gj / (std::sqrt(aj + h[1]) + h[2]));
      }
      break;
    }
    case ApplySpec::kAdam: {  // alpha (lr with bias correction), 1 - beta1, 1 - beta2, eps
      V *m = s[0], *v = s[1];
      const C one_b1 = h[1], one_b2 = h[2];
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]);
        const C mj = ld(m[j]) + (gj - ld(m[j])) * one_b1;
        const C vj = ld(v[j]) + (gj * gj - ld(v[j])) * one_b2;
        m[j] = st(mj);
        v[j] = st(vj);
        w[j] = st(ld(w[j]) - mj * h[0] / (std::sqrt(vj) + h[3]));
      }
      break;
    }
    case ApplySpec::kFtrl: {  // lr, l1, l2 (beta folded in), l2 shrinkage, lr power
      V *acc = s[0], *lin = s[1];
      const C lr = h[0], l1 = h[1], l2 = h[2], shrink = h[3], p = -h[4];
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]), wj = ld(w[j]), aj = ld(acc[j]);
        const C na = aj + gj * gj;
        const C pow_new = p == C(0.5) ? std::sqrt(na) : std::pow(na, p);
        const C pow_old = p == C(0.5) ? std::sqrt(aj) : std::pow(aj, p);
        const C lj = ld(lin[j]) + ((gj + C(2) * shrink * wj) - (pow_new - pow_old) / lr * wj);
        const C quad = pow_new / lr + C(2) * l2;
        lin[j] = st(lj);
        w[j] = st((std::max(-l1, std::min(l1, lj)) - lj) / quad);
        acc[j] = st(na);
      }
      break;
    }
    case ApplySpec::kRmsProp: {
      // lr, rho, 1 - rho, momentum, eps inside the root, eps outside, centered, and the
      // form of the averages: 0 as TF's kernels (a + (x - a) * (1 - rho)), 1 as Keras'
      // (rho * a + (1 - rho) * x)
      V *ms = s[0], *mom = s[1], *mg = s[2];
      const C rho = h[1], one_rho = h[2];
      const bool keras_form = h[7] != C(0);
      auto average = [&](C a, C x) { return keras_form ? rho * a + one_rho * x : a + (x - a) * one_rho; };
      for (int64_t j = 0; j < dim; ++j) {
        const C gj = ld(g[j]);
        const C msj = average(ld(ms[j]), gj * gj);
        ms[j] = st(msj);
        C denom = msj;
        if (h[6] != C(0)) {
          const C mgj = average(ld(mg[j]), gj);
          mg[j] = st(mgj);
          denom = msj - mgj * mgj;
        }
        const C inc = h[0] * gj / (std::sqrt(denom + h[4]) + h[5]);
        if (mom != nullptr) {
          const C mj = ld(mom[j]) * h[3] + inc;
          mom[j] = st(mj);
          w[j] = st(ld(w[j]) - mj);
        } else {
          w[j] = st(ld(w[j]) - inc);
        }
      }
      break;
    }
  }
}

template <class K, class V>
inline Status Table<K, V>::ApplyGradients(OpKernelContext* ctx, const Tensor& keys,
                                          const Tensor& grads, const ApplySpec& spec) {
  if constexpr (!std::is_floating_point<V>::value && !std::is_same<V, Eigen::half>::value &&
                !std::is_same<V, Eigen::bfloat16>::value) {
    return absl::InvalidArgumentError("optimizer updates need a floating-point table");
  } else {
    using C = ComputeOf<V>;
    const int nslots = static_cast<int>(spec.slot_groups.size());
    for (int g : spec.slot_groups) {
      if (g < 0) continue;  // a slot this configuration does not keep
      TF_RETURN_IF_ERROR(CheckGroup(g));
      if (g == 0) return absl::InvalidArgumentError("slot group 0 is the row, not a slot");
    }
    UpdateRule<C> rule;
    rule.kind = spec.kind;
    for (int k = 0; k < ApplySpec::kMaxHyper; ++k) rule.h[k] = static_cast<C>(spec.hyper[k]);
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const int64_t dim = cfg_.dim;
    const V* g = grads.flat<V>().data();
    const V* init_rows = spec.init_rows == nullptr ? nullptr : spec.init_rows->flat<V>().data();
    uint32_t written = 0;  // the slot groups this update writes (their keys: de_slab.h)
    for (int sg : spec.slot_groups) {
      if (sg > 0) written |= 1u << sg;
    }
    const uint32_t stamp = CurrentStamp();
    return ForEachShard(ctx, b, Lock::kExclusive, [&](Shard& s, int64_t lo, int64_t hi) {
      PrepareNewRows(s, static_cast<size_t>(hi - lo));
      NoteWriteStamp(s, stamp);
      auto pre = [&](int64_t i) { PrefetchRow(g + i * dim, /*write=*/false); };
      return ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) -> Status {
        bool fresh = false;
        if (row < 0) {
          uint32_t r;
          TF_RETURN_IF_ERROR(InsertNewBounded(s, b, b.keys[i], h, stamp, &r, &fresh, -1));
          row = r;
          if (fresh) {  // the row the trainer saw: drawn again, or sent
            V* w = GVals(s, row, 0);
            if (init_rows != nullptr) {
              std::memcpy(w, init_rows + i * dim, layout_.row_bytes);
            } else {
              FillInitRow(spec.init, InitHash(spec.init, b.keys[i], h), dim, w);
            }
          }
        }
        V* slots[ApplySpec::kMaxSlots] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < nslots; ++k) {
          if (spec.slot_groups[k] >= 0) slots[k] = GVals(s, row, spec.slot_groups[k]);
        }
        ApplyRow<V, C>(rule, dim, GVals(s, row, 0), slots, g + i * dim);
        SetMeta(s, row, stamp, fresh ? 1 : BumpFreq(s, row));
        MarkWritten(s, row, written);
        return absl::OkStatus();
      });
    });
  }
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_APPLY_H_
