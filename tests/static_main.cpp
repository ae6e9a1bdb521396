// The main of test_static: tests/static/*.cpp are static_assert-only, so building
// this executable is the test, and running it only confirms the link.
int main() { return 0; }
