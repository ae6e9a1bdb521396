# Makes the CIFAR-10 folders the tests of resnet50_cifar10 on bad input read (a few KiB):
#   DIR/no_batch_1  data_batch_2.bin ... data_batch_5.bin and test_batch.bin of one record
#                   each, no data_batch_1.bin
#   DIR/truncated   the six files of one record each, but data_batch_3.bin: two records
#                   and 1000 bytes more (7146 bytes)
#
#   cmake -DDIR=... -P make_bad_cifar10.cmake
if(NOT DIR)
  message(FATAL_ERROR "make_bad_cifar10.cmake: give -DDIR=<folder>")
endif()
file(REMOVE_RECURSE "${DIR}")
# One 3073-byte record: label 1, then the 3x32x32 image's bytes ('0').
string(ASCII 1 label)
string(REPEAT "0" 3072 image)
set(record "${label}${image}")
string(REPEAT "0" 1000 tail)

foreach(f IN ITEMS data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch)
  file(WRITE "${DIR}/no_batch_1/${f}.bin" "${record}")
endforeach()
foreach(f IN ITEMS data_batch_1 data_batch_2 data_batch_4 data_batch_5 test_batch)
  file(WRITE "${DIR}/truncated/${f}.bin" "${record}")
endforeach()
file(WRITE "${DIR}/truncated/data_batch_3.bin" "${record}${record}${tail}")
