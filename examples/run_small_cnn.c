/* Runs the small CNN compiled by polyc from C: no Python, no polyc at run time.
 *
 *   polyc compile examples/small_cnn.onnx -o build/small_cnn
 *   gcc examples/run_small_cnn.c -Ibuild/small_cnn build/small_cnn/small_cnn.so \
 *       -Wl,-rpath,build/small_cnn -o build/run_small_cnn
 *   build/run_small_cnn build/small_cnn/small_cnn.weights input.bin output.bin
 *
 * input.bin holds the input tensor as raw float32; output.bin receives the output.
 */
#include <stdio.h>
#include <stdlib.h>

#include "small_cnn.h"

static int read_floats(const char *path, float *dst, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t got = fread(dst, sizeof(float), n, f);
    fclose(f);
    return got == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s WEIGHTS INPUT.bin OUTPUT.bin\n", argv[0]);
        return 2;
    }
    static float x[small_cnn_INPUT0_SIZE], y[small_cnn_OUTPUT0_SIZE];
    if (read_floats(argv[2], x, small_cnn_INPUT0_SIZE) != 0) {
        fprintf(stderr, "cannot read %d floats from %s\n", small_cnn_INPUT0_SIZE, argv[2]);
        return 1;
    }
    small_cnn_model *model = small_cnn_init(argv[1]);
    if (!model) {
        fprintf(stderr, "cannot load the weights from %s\n", argv[1]);
        return 1;
    }
    int status = small_cnn_run(model, x, y);
    small_cnn_free(model);
    if (status != 0) {
        fprintf(stderr, "run failed with status %d\n", status);
        return 1;
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(y, sizeof(float), small_cnn_OUTPUT0_SIZE, f) != small_cnn_OUTPUT0_SIZE) {
        fprintf(stderr, "cannot write %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    printf("C program: %s -> %d outputs, y[0] = %g\n", small_cnn_OUTPUT0_NAME,
           small_cnn_OUTPUT0_SIZE, (double)y[0]);
    return 0;
}
