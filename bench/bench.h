/* bench/ — benchmarks behind `loco bench NAME`. Each prints a table that
 * puts loco's figure beside a reference measured in the same run. They
 * return 0 or a negative LOCO_E* code; argv excludes "bench NAME". */
#ifndef LOCO_BENCH_H
#define LOCO_BENCH_H

#include "inner/mesh/mesh.h"
#include "net/net.h"

/* Training step throughput (tiny and GPT-2 124M shapes) against sgemm. */
int loco_bench_step(int argc, char **argv);
/* Bytes per rank of parameters, gradients, optimizer state, unit buffers
 * and activations beside the ZeRO formula (run under mpirun). */
int loco_bench_memory(int argc, char **argv);
/* bench_memory.c's --plan: the figures of a mesh from tables and formulas alone. */
int loco_bench_memory_plan(const loco_config *cfg, const char *path);
/* bench_memory_device.c: the device model's activations per block beside
 * the formulas (skipped without CUDA or a device). */
int loco_bench_memory_device(const loco_config *cfg, loco_mesh *mesh, loco_comm *world);
/* One outer step between two islands over emulated WAN, per codec, beside
 * the bound encoded bytes / bandwidth + RTT. */
int loco_bench_exchange(int argc, char **argv);
/* Pseudo-gradient codecs against memcpy and raw libzstd. */
int loco_bench_compress(int argc, char **argv);
/* State transfer to a rejoining island over emulated WAN (TLS). */
int loco_bench_rejoin(int argc, char **argv);
/* The pipeline executor in synthetic mode (compute = sleeps, real
 * messages) beside the schedule simulator, every schedule (run under
 * mpirun -np p). */
int loco_bench_pipeline(int argc, char **argv);
/* Byte-level BPE encoding MB/s (one core, all cores) beside GPT-2's regex
 * split alone and the Python reference BPE of tests/fixtures. */
int loco_bench_tokenizer(int argc, char **argv);

/* Makes a PKI for siteA and siteB in dir (a mkdtemp template, filled in)
 * and their link parameters over emulated WAN: gbps and rtt_ms, TLS over
 * `streams` connections. The caller removes dir. */
int bench_wan_pair(char *dir, double gbps, double rtt_ms, int streams, loco_net_params *pa,
                   loco_net_params *pb);

#endif /* LOCO_BENCH_H */
