// TfraDeApplyGradients: optimizer updates of several tables applied where
// they live, in one op (one call per parameter server and step). The update
// rules are in de_apply.h.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_grouped.h"
#include "de_kernel.h"
#include "de_table.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfra_de {
namespace {

REGISTER_OP("TfraDeApplyGradients")
    .Input("tables: N * resource")
    .Input("keys: key_dtype")
    .Input("counts: int64")
    .Input("grads: value_dtype")
    .Input("init_rows: value_dtype")
    .Input("init_args: N * double")
    .Input("fills: N * double")
    .Input("hyper: double")
    .Attr("N: int >= 1")
    .Attr("key_dtype: {int32, int64, string}")
    .Attr("value_dtype: {half, bfloat16, float, double}")
    .Attr("optimizer: {'sgd', 'momentum', 'keras_momentum', 'adagrad', 'adam', 'ftrl', "
          "'rmsprop'}")
    .Attr("slot_groups: list(int) = []")
    .Attr("inits: list(string)")
    .Attr("seeds: list(int)")
    .Attr("keyed: list(bool)")
    .Attr("sent_rows: list(bool)")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Applies one optimizer step to the rows and slot column groups of N tables. Table "
         "i's unique keys are counts[i] consecutive entries of keys (1-D, every table's in "
         "turn), and their summed gradients the matching [counts[i], dim_i] block of grads "
         "(flat). A missing key is created: its row is its row in init_rows when sent_rows[i] "
         "(flat: the [counts[i], dim_i] blocks of those tables, in turn), else drawn like "
         "TfraDeFindInit's (inits[i], init_args[i], seeds[i], keyed[i]); its slots start at "
         "fills[i] (the start values of the table's groups 1, 2, ...). One tensor of each kind "
         "per call: a parameter server receives a step's update of all its tables at once. "
         "hyper: the rule's numbers, evaluated by the caller this step: [decay, then per "
         "optimizer] sgd: lr; momentum (TF: a = a*mu + g) and keras_momentum (a = a*mu - lr*g): "
         "lr, mu, nesterov; adagrad: lr, eps inside the root, eps outside; adam: lr * sqrt(1 - "
         "beta2^t) / (1 - beta1^t), 1 - beta1, 1 - beta2, eps; ftrl: lr, l1, l2 + beta / (2 "
         "lr), l2 shrinkage, lr power; rmsprop: lr, rho, 1 - rho, momentum, eps inside, eps "
         "outside, centered, form (0: a + (x - a)(1 - rho) as TF's kernels, 1: rho a + (1 - "
         "rho) x as Keras'). decay: w -= w * decay first (decoupled weight decay). "
         "slot_groups: per table, the column group of each slot of the rule (momentum: 1; "
         "adagrad: 1; adam: m, v; ftrl: accumulator, linear; rmsprop: ms, mom, mg, the last "
         "two -1 when not kept).");

// The slots each rule keeps, and which of them may be absent (-1).
struct RuleSlots {
  int count;
  int required;
};

RuleSlots SlotsOf(ApplySpec::Kind kind) {
  switch (kind) {
    case ApplySpec::kSgd: return {0, 0};
    case ApplySpec::kMomentum:
    case ApplySpec::kKerasMomentum:
    case ApplySpec::kAdagrad: return {1, 1};
    case ApplySpec::kAdam:
    case ApplySpec::kFtrl: return {2, 2};
    case ApplySpec::kRmsProp: return {3, 1};
  }
  return {0, 0};
}

ApplySpec::Kind KindOf(const std::string& name) {
  if (name == "momentum") return ApplySpec::kMomentum;
  if (name == "keras_momentum") return ApplySpec::kKerasMomentum;
  if (name == "adagrad") return ApplySpec::kAdagrad;
  if (name == "adam") return ApplySpec::kAdam;
  if (name == "ftrl") return ApplySpec::kFtrl;
  if (name == "rmsprop") return ApplySpec::kRmsProp;
  return ApplySpec::kSgd;
}

class ApplyGradientsOp : public OpKernel {
 public:
  explicit ApplyGradientsOp(OpKernelConstruction* c) : OpKernel(c) {
    std::string optimizer;
    std::vector<int32_t> groups;
    std::vector<bool> sent_rows;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &key_dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &value_dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("optimizer", &optimizer));
    OP_REQUIRES_OK(c, c->GetAttr("slot_groups", &groups));
    OP_REQUIRES_OK(c, ReadInitAttrs(c, n_, &inits_));
    OP_REQUIRES_OK(c, c->GetAttr("sent_rows", &sent_rows));
    kind_ = KindOf(optimizer);
    const RuleSlots slots = SlotsOf(kind_);
    OP_REQUIRES(c, static_cast<int64_t>(groups.size()) == int64_t{n_} * slots.count,
                absl::InvalidArgumentError(absl::StrCat(
                    "slot_groups must hold ", slots.count, " groups per table for ", optimizer,
                    " (", n_, " tables), got ", groups.size())));
    OP_REQUIRES(c, static_cast<int>(sent_rows.size()) == n_,
                absl::InvalidArgumentError(absl::StrCat(
                    "sent_rows must hold one entry per table (", n_, "), got ",
                    sent_rows.size())));
    sent_rows_.assign(sent_rows.begin(), sent_rows.end());
    for (int i = 0; i < n_; ++i) {
      std::vector<int> table_groups;
      for (int k = 0; k < slots.count; ++k) {
        const int g = groups[i * slots.count + k];
        const bool optional = k >= slots.required;
        OP_REQUIRES(c, (g >= 1 || (optional && g == -1)) && g < kMaxGroups,
                    absl::InvalidArgumentError(absl::StrCat(
                        "slot_groups[", i * slots.count + k, "] of ", optimizer, " must be in [1, ",
                        kMaxGroups, ")", optional ? " or -1" : "", ", got ", g)));
        table_groups.push_back(g);
      }
      groups_.push_back(table_groups);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const Tensor& keys = ctx->input(n_);
      const Tensor& counts = ctx->input(n_ + 1);
      const Tensor& grads = ctx->input(n_ + 2);
      const Tensor& init_rows = ctx->input(n_ + 3);
      const Tensor& hyper = ctx->input(3 * n_ + 4);
      OP_REQUIRES_OK(ctx, CheckKeys(keys));
      OP_REQUIRES(ctx, hyper.dims() == 1 && hyper.NumElements() <= ApplySpec::kMaxHyper,
                  absl::InvalidArgumentError(absl::StrCat(
                      "hyper must be a 1-D tensor of at most ", ApplySpec::kMaxHyper,
                      " numbers, got shape ", hyper.shape().DebugString())));
      int64_t nkeys = 0, ngrads = 0, nrows = 0;
      OP_REQUIRES_OK(ctx, ReadCounts(counts, n_, &nkeys));
      std::vector<TableRef> tables(n_);
      for (int i = 0; i < n_; ++i) {
        OP_REQUIRES_OK(ctx, ResolveListedTable(ctx, i, key_dtype_, value_dtype_, &tables[i]));
        const int64_t c = counts.flat<int64_t>()(i);
        ngrads += c * tables[i]->dim();
        if (sent_rows_[i]) nrows += c * tables[i]->dim();
      }
      OP_REQUIRES(ctx, keys.NumElements() == nkeys,
                  absl::InvalidArgumentError(absl::StrCat(
                      "keys must hold sum(counts) = ", nkeys, " keys, got ", keys.NumElements())));
      OP_REQUIRES(ctx, grads.NumElements() == ngrads,
                  absl::InvalidArgumentError(absl::StrCat(
                      "grads must hold sum(counts[i] * dim_i) = ", ngrads, " values (one row per "
                      "key), got ", grads.NumElements())));
      OP_REQUIRES(ctx, init_rows.NumElements() == nrows,
                  absl::InvalidArgumentError(absl::StrCat(
                      "init_rows must hold the rows of the tables with sent_rows: ", nrows,
                      " values, got ", init_rows.NumElements())));
      int64_t key_at = 0, grad_at = 0, row_at = 0;
      for (int i = 0; i < n_; ++i) {
        const int64_t c = counts.flat<int64_t>()(i), dim = tables[i]->dim();
        Tensor table_keys, table_grads, table_rows;
        OP_REQUIRES_OK(ctx, CopyFlatSlice(ctx, keys, key_at, c, {c}, &table_keys));
        OP_REQUIRES_OK(ctx, CopyFlatSlice(ctx, grads, grad_at, c * dim, {c, dim}, &table_grads));
        if (sent_rows_[i]) {
          OP_REQUIRES_OK(ctx, CopyFlatSlice(ctx, init_rows, row_at, c * dim, {c, dim}, &table_rows));
          row_at += c * dim;
        }
        key_at += c;
        grad_at += c * dim;
        OP_REQUIRES_OK(ctx, ApplyOne(ctx, i, tables[i].get(), table_keys, table_grads,
                                     sent_rows_[i] ? &table_rows : nullptr, hyper));
      }
    });
  }

 private:
  Status ApplyOne(OpKernelContext* ctx, int i, TableBase* table, const Tensor& keys,
                  const Tensor& grads, const Tensor* init_rows, const Tensor& hyper) {
    const TableConfig& cfg = table->config();
    ApplySpec spec;
    spec.kind = kind_;
    const auto hv = hyper.flat<double>();
    for (int64_t k = 0; k < hv.size(); ++k) spec.hyper[k] = hv(k);
    spec.slot_groups = groups_[i];
    spec.init = inits_[i];
    if (init_rows == nullptr) {
      TF_RETURN_IF_ERROR(ReadInitArgs(ctx->input(n_ + 4 + i), cfg.dim, &spec.init));
      TF_RETURN_IF_ERROR(CheckInitSpec(spec.init));
    } else {
      spec.init_rows = init_rows;
    }
    std::vector<double> fills;
    TF_RETURN_IF_ERROR(ReadFills(ctx->input(2 * n_ + 4 + i), &fills));
    for (int g : spec.slot_groups) {
      if (g > static_cast<int>(fills.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fills[", i, "] must hold the start values of groups 1..", g, ", got ", fills.size()));
      }
    }
    if (!fills.empty()) TF_RETURN_IF_ERROR(table->EnsureGroups(fills));
    return table->ApplyGradients(ctx, keys, grads, spec);
  }

  int n_ = 0;
  DataType key_dtype_ = tensorflow::DT_INVALID;
  DataType value_dtype_ = tensorflow::DT_INVALID;
  ApplySpec::Kind kind_ = ApplySpec::kSgd;
  std::vector<std::vector<int>> groups_;
  std::vector<InitSpec> inits_;
  std::vector<bool> sent_rows_;
};

REGISTER_KERNEL_BUILDER(Name("TfraDeApplyGradients").Device(tensorflow::DEVICE_CPU),
                        ApplyGradientsOp);

}  // namespace
}  // namespace tfra_de
