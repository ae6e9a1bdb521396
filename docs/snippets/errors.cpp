// docs/errors.md: a failed check of the layout algebra at run time, its message and its
// code; the message is the rule of the error table and the numbers.
// ranks: 1
#include <string>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](tessera::any_communicator&) {
    std::string message;
    tessera::errc code = tessera::errc::ok;
    // [catch]
    try {
      tessera::require(tessera::check(tessera::layout{tessera::mesh{4}, {{0}}}, tessera::extents{10}));
    } catch (const tessera::error& e) {
      // e.what(): "layout: a tensor dim must be divisible by the product of its splits:
      //            dim 0 has extent 10, split into 4 pieces"
      // e.why().code == tessera::errc::dim_not_divisible
      message = e.what();
      code = e.why().code;
    }
    // [/catch]
    if (message != "layout: a tensor dim must be divisible by the product of its splits: dim 0 has extent 10, "
                   "split into 4 pieces" ||
        code != tessera::errc::dim_not_divisible)
      throw tessera::error("errors snippet: got \"" + message + "\"");
  });
}
