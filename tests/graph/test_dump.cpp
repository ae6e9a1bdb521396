// The dumps contain what they promise: step_parallel_begin.ir every node with its
// strategy and source and global shapes; execute.ir every rank's local shapes, one
// entry per step of every planned redistribution and collective with its kind, mesh
// axis, this rank's group and bytes, and a total equal to the plan's; execute.dot the
// same graph; save_graphs the three files per rank.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>
#include <tessera/graph/dump.hpp>

namespace graph_test_dump {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::graph;

namespace {

traced_graph quickstart() {
  graph_builder b;
  const value x = b.input("input", {16, 32}), label = b.input("label", {16, 16});
  const value w = b.parameter("w", {32, 16}), w2 = b.parameter("w2", {16, 16});
  const value h = b.relu(b.matmul(x, w).shard({{2, 4}, {4, 1}}));
  return b.build(b.mse_loss(b.matmul(h, w2), label));
}

parallel_graph auto8() {
  parallel_config c;
  c.mode = parallel_mode::auto_parallel;
  c.device_num = 8;
  return parallelize(quickstart(), c);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

std::string shapes_text(const std::vector<extents>& in, const extents& out) {
  std::string s = "    : (";
  for (std::size_t i = 0; i < in.size(); ++i) s += (i ? ", " : "") + tensor_text(in[i], 4);
  return s + ") -> (" + tensor_text(out, 4) + ")";
}

// The line after the entry of node `name` (its signature).
std::string signature_of(const std::vector<std::string>& ls, const std::string& name, const std::string& type) {
  for (std::size_t i = 0; i + 1 < ls.size(); ++i)
    if (ls[i].find("(" + name + ") = " + type + "(") != std::string::npos) return ls[i + 1];
  return "<no entry for " + name + ">";
}

}  // namespace

TEST_CASE("step_parallel_begin.ir: every node with its strategy, where it came from, and global shapes") {
  const parallel_graph pg = auto8();
  const std::string ir = step_parallel_begin_ir(pg, 0);
  const std::vector<std::string> ls = lines(ir);
  CHECK(ls[1] == "# parallel_mode: auto_parallel, search_mode: sharding_propagation, dataset_strategy: data_parallel, "
                 "device_num: 8, rank: 0");
  CHECK(ir.find("%0(input) = Input() {dataset_strategy: (8, 1)}\n    : () -> (<Tensor[Float32], (16, 32)>)\n") !=
        std::string::npos);
  CHECK(ir.find("%2(w) = Parameter() {layerwise_parallel: false}\n") != std::string::npos);
  CHECK(ir.find("%4(matmul) = MatMul(%0, %2) {transpose_a: false, transpose_b: false} {in_strategy: ((2, 4), (4, 1)), "
                "source: user}\n    : (<Tensor[Float32], (16, 32)>, <Tensor[Float32], (32, 16)>) -> "
                "(<Tensor[Float32], (16, 16)>)\n") != std::string::npos);
  CHECK(ir.find("%5(relu) = ReLU(%4) {in_strategy: ((2, 4),), source: sharding_propagation}\n") != std::string::npos);
  const traced_graph& g = pg.traced();
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op)
      CHECK(ir.find("%" + std::to_string(id) + "(" + g.at(id).name + ") = " + g.at(id).op->type()) != std::string::npos);
  CHECK(ls.back() == "return %9");
}

TEST_CASE("execute.ir: local shapes, the inserted communication with its groups and bytes, the total") {
  const parallel_graph pg = auto8();
  const traced_graph& g = pg.traced();
  for (int rank : {0, 5}) {
    CAPTURE(rank);
    const std::string ir = execute_ir(pg, rank);
    const std::vector<std::string> ls = lines(ir);
    // Every operator's local input and output shapes.
    for (int id = 0; id < g.size(); ++id) {
      const node& n = g.at(id);
      if (n.kind != node_kind::op) continue;
      std::vector<extents> in;
      for (std::size_t s = 0; s < n.inputs.size(); ++s) in.push_back(local_shape(pg.op(id).lay.in[s], g.at(n.inputs[s]).shape));
      CHECK(signature_of(ls, n.name, n.op->type()) == shapes_text(in, pg.local_shape(id)));
    }
    // The seed's MatMul: (8, 8) x (8, 16) -> (8, 16), and its partial sums reduce-scattered
    // over this rank's row of the (2, 4) device matrix.
    CHECK(signature_of(ls, "matmul", "MatMul") == shapes_text({extents{8, 8}, extents{8, 16}}, extents{8, 16}));
    const std::string row = rank == 0 ? "(0, 1, 2, 3)" : "(4, 5, 6, 7)";
    CHECK(ir.find("= ReduceScatter(%5) {op: sum, mesh: (2, 4), axis: 1, dim: 1, rank_list: " + row + ", bytes: 384}\n" +
                  shapes_text({extents{8, 16}}, extents{8, 4}) + "\n    # redistribution: matmul -> relu (input 0)\n") !=
          std::string::npos);
    // One entry per step of every route and collective; their bytes add up to the total.
    int steps = int(pg.loss_fetch().p.size());
    for (const edge_plan& e : pg.edges()) steps += e.forward.p.size() + (e.has_backward ? e.backward.p.size() : 0);
    const std::regex comm(R"(^%\d+ = (StridedSlice|AllGather|AllReduce|ReduceScatter|AllToAll|Mask|Expand|Exchange)\(%\d+\) \{.*bytes: (\d+)\}$)");
    int found = 0;
    index_t sum = 0;
    for (const std::string& l : ls) {
      std::smatch m;
      if (std::regex_match(l, m, comm)) {
        ++found;
        sum += std::stoll(m[2]);
      }
    }
    CHECK(found == steps);
    CHECK(sum == pg.bytes_for_rank(rank));
    CHECK(ls.back().find("total " + std::to_string(pg.bytes_for_rank(rank))) != std::string::npos);
    CHECK(ls[ls.size() - 2] == "return %29");  // the loss after its two AllReduces
    CHECK(ir.find("# backward\n") != std::string::npos);
    CHECK(ir.find("# gradient: matmul (input 1) -> w\n") != std::string::npos);  // the AllReduce of w's gradient
  }
}

TEST_CASE("execute.ir: collectives inside operators, and hybrid_parallel's") {
  graph_builder b;
  const value x = b.input("x", {16, 8}), labels = b.input("labels", {16, 4});
  const value w = b.parameter("w", {8, 4}, true);
  const value bias = b.parameter("b", {4});
  const value logits = b.bias_add(b.all_reduce(b.matmul(x, w)), bias);
  const traced_graph g = b.build(b.reduce_mean(b.softmax_cross_entropy(logits, labels)));
  parallel_config c;
  c.mode = parallel_mode::hybrid_parallel;
  c.device_num = 4;
  const parallel_graph pg = parallelize(g, c);
  const std::string ir = execute_ir(pg, 2);
  CHECK(ir.find("%6 = AllReduce(%5) {op: sum, mesh: (4,), axes: (0,), rank_list: (0, 1, 2, 3), bytes: 384}\n"
                "    # inside AllReduce 'all_reduce': the sum over the group\n"
                "%7(bias_add) = BiasAdd(%6, %3)") != std::string::npos);
  CHECK(ir.find("OnesLike(%") != std::string::npos);
  CHECK(ir.find("{value: 1/4: the objective is the mean of the ranks' losses}") != std::string::npos);
  CHECK(ir.find("rank_list: (0, 1, 2, 3), bytes: 24}\n    : (<Tensor[Float32], (4,)>) -> (<Tensor[Float32], (4,)>)\n"
                "    # gradient of parameter 'b' (not layer-wise parallel): summed over the ranks\n") != std::string::npos);
  CHECK(ir.find("gradient of parameter 'w'") == std::string::npos);  // layer-wise: kept local
  CHECK(lines(ir).back().find("total " + std::to_string(pg.bytes_for_rank(2))) != std::string::npos);
  // A class-split cross entropy combines its row statistics over the class axis.
  graph_builder s;
  const value sx = s.input("x", {16, 8}), sl = s.input("labels", {16, 8});
  const traced_graph sg = s.build(s.reduce_mean(s.softmax_cross_entropy(s.relu(sx), sl).shard({{2, 4}, {2, 4}})));
  c.mode = parallel_mode::semi_auto_parallel;
  c.device_num = 8;
  c.dataset = dataset_strategy::full_batch();
  const std::string ce = execute_ir(parallelize(sg, c), 0);
  CHECK(ce.find("{op: max, mesh: (2, 4), axes: (1,), rank_list: (0, 1, 2, 3), bytes: 48}\n    # inside "
                "SoftmaxCrossEntropyWithLogits 'softmax_cross_entropy': row maxima\n") != std::string::npos);
}

TEST_CASE("execute.dot: the same entries, communication highlighted") {
  const parallel_graph pg = auto8();
  const std::string dot = execute_dot(pg, 0);
  const std::string ir = execute_ir(pg, 0);
  CHECK(dot.rfind("digraph execute_rank_0 {\n", 0) == 0);
  CHECK(dot.substr(dot.size() - 2) == "}\n");
  int open = 0;
  for (char ch : dot) open += ch == '{' ? 1 : ch == '}' ? -1 : 0;
  CHECK(open == 0);
  // One node per IR entry; the communication ones filled.
  const std::regex entry(R"(^%\d+)"), node(R"(^\s+n\d+ \[label=)");
  int entries = 0, nodes = 0, filled = 0, comm = 0;
  for (const std::string& l : lines(ir)) entries += std::regex_search(l, entry);
  for (const std::string& l : lines(ir)) comm += l.find("bytes: ") != std::string::npos && l[0] == '%';
  for (const std::string& l : lines(dot)) {
    nodes += std::regex_search(l, node);
    filled += l.find("fillcolor=\"#ffb347\"") != std::string::npos;
  }
  CHECK(nodes == entries);
  CHECK(filled == comm);
  CHECK(dot.find("label=\"matmul\\nMatMul\\n(8, 8) x (8, 16) -> (8, 16)\"") != std::string::npos);
  CHECK(dot.find("subgraph cluster_backward {") != std::string::npos);
}

TEST_CASE("save_graphs: three files per rank") {
  const parallel_graph pg = auto8();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessera_test_dump";
  std::filesystem::remove_all(dir);
  for (int r : {0, 7}) save_graphs(pg, dir, r);
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  CHECK(read(dir / "rank_0" / "step_parallel_begin.ir") == step_parallel_begin_ir(pg, 0));
  CHECK(read(dir / "rank_7" / "execute.ir") == execute_ir(pg, 7));
  CHECK(read(dir / "rank_7" / "execute.dot") == execute_dot(pg, 7));
  CHECK(!std::filesystem::exists(dir / "rank_3"));
  // A file where the folder should be.
  std::ofstream(dir / "blocked") << "x";
  CHECK_THROWS_AS(save_graphs(pg, dir / "blocked", 0), error);
  try {
    save_graphs(pg, dir / "blocked", 0);
  } catch (const error& e) {
    CHECK(std::string(e.what()).rfind("save_graphs: cannot create " + (dir / "blocked" / "rank_0").string() + ": ", 0) == 0);
  }
  std::filesystem::remove_all(dir);
}
}  // namespace graph_test_dump
