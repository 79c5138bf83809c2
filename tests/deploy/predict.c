/* Run an exported model with MXNet's C predict API: no Python in the process.
 *
 *   predict SYMBOL_JSON PARAMS OUTDIR NAME NDIM D0 .. DN-1 FILE [NAME NDIM ... FILE]...
 *
 * Each input is a file of raw float32 values (C order) at the shape given.  Writes
 * OUTDIR/output_<i>.bin per output: int32 dtype code (MXNet's), uint32 ndim, uint32 shape[ndim],
 * then the float32 values MXPredGetOutput gives.  Exits 1 with MXNet's message on stderr
 * when a call fails.  Built by tests/deploy/c_predict.py against the wheel's
 * include/mxnet/c_predict_api.h and libmxnet.so.
 */
#include <stdbool.h> /* c_predict_api.h uses bool without including it */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxnet/c_predict_api.h>

/* From c_api.h (which needs more than C99).  Python's mxnet calls it at exit; a program
   that exits without it lets the engine's destructor join worker threads that still flush
   their thread-local bulk state: measured 4 aborts ("vector::reserve", "corrupted size vs.
   prev_size", "terminate called without an active exception") and 1 hang in 690 runs of
   these models under load, all after every output was written; 0 in 690 with the call. */
int MXNotifyShutdown(void);

static char *slurp(const char *path, long *size) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(2);
  }
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(*size + 1);
  if (fread(buf, 1, *size, f) != (size_t)*size) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(2);
  }
  buf[*size] = 0;
  fclose(f);
  return buf;
}

#define CHECK(call)                                                  \
  if ((call) != 0) {                                                 \
    fprintf(stderr, "%s failed: %s\n", #call, MXGetLastError());     \
    return 1;                                                        \
  }

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s SYMBOL PARAMS OUTDIR [NAME NDIM DIMS... FILE]...\n", argv[0]);
    return 2;
  }
  long json_size, params_size;
  char *json = slurp(argv[1], &json_size);
  char *params = slurp(argv[2], &params_size);
  const char *outdir = argv[3];
  const char *keys[64];
  const char *files[64];
  uint32_t indptr[65], shape[512];
  uint32_t n = 0, used = 0;
  indptr[0] = 0;
  for (int a = 4; a < argc; n++) {
    keys[n] = argv[a++];
    uint32_t ndim = (uint32_t)atoi(argv[a++]);
    for (uint32_t d = 0; d < ndim; d++) shape[used++] = (uint32_t)atoi(argv[a++]);
    indptr[n + 1] = used;
    files[n] = argv[a++];
  }
  PredictorHandle pred = NULL;
  CHECK(MXPredCreate(json, params, (int)params_size, 1, 0, n, keys, indptr, shape, &pred));
  for (uint32_t i = 0; i < n; i++) {
    long size;
    float *data = (float *)slurp(files[i], &size);
    CHECK(MXPredSetInput(pred, keys[i], data, (uint32_t)(size / sizeof(float))));
    free(data);
  }
  CHECK(MXPredForward(pred));
  for (uint32_t i = 0;; i++) {
    /* MXNet 1.9.1's MXPredGetOutputType writes out_dtype[out_index], not *out_dtype
       (measured): it gets an array of i + 1 ints. */
    int *dtypes = malloc(sizeof(int) * (i + 1));
    if (MXPredGetOutputType(pred, i, dtypes) != 0) { /* no output i */
      free(dtypes);
      break;
    }
    int32_t code = dtypes[i];
    free(dtypes);
    uint32_t *dims, ndim;
    CHECK(MXPredGetOutputShape(pred, i, &dims, &ndim));
    uint32_t out_shape[32], size = 1;
    for (uint32_t d = 0; d < ndim; d++) size *= (out_shape[d] = dims[d]);
    float *out = malloc(sizeof(float) * (size ? size : 1));
    CHECK(MXPredGetOutput(pred, i, out, size));
    char path[4096];
    snprintf(path, sizeof path, "%s/output_%u.bin", outdir, i);
    FILE *f = fopen(path, "wb");
    fwrite(&code, sizeof code, 1, f);
    fwrite(&ndim, sizeof ndim, 1, f);
    fwrite(out_shape, sizeof(uint32_t), ndim, f);
    fwrite(out, sizeof(float), size, f);
    fclose(f);
    free(out);
  }
  CHECK(MXPredFree(pred));
  CHECK(MXNotifyShutdown());
  free(json);
  free(params);
  return 0;
}
