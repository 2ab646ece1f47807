/* What libjpeg-turbo's DCT scaling by N/8 costs, N = 8..1: full decodes of the given JPEGs to RGB at each scale,
 * this thread's CPU microseconds per image (third of three passes). Written for issue 32 item 3 to decide whether
 * the fused path should pick the smallest sufficient N/8 rather than only 1/2, 1/4, 1/8 (csrc/batch.cc's
 * choose_dct_denom): with libjpeg-turbo 2.1.5 the scales other than 8/8, 4/8, 2/8 and 1/8 use its plain-C
 * IDCTs and are slower than not scaling at all (bench/results/jpeg_cpu2.md).
 *
 *   cc -O2 bench/jpeg_scale_probe.c -ljpeg -o /tmp/jpeg_scale_probe && /tmp/jpeg_scale_probe FILE.jpg ...
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jpeglib.h>

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  int n = argc - 1;
  if (n < 1) {
    fprintf(stderr, "usage: %s FILE.jpg ...\n", argv[0]);
    return 2;
  }
  unsigned char** buf = malloc(n * sizeof *buf);
  long* len = malloc(n * sizeof *len);
  for (int i = 0; i < n; i++) {
    FILE* f = fopen(argv[i + 1], "rb");
    if (!f) {
      perror(argv[i + 1]);
      return 1;
    }
    fseek(f, 0, SEEK_END);
    len[i] = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf[i] = malloc(len[i]);
    if (fread(buf[i], 1, len[i], f) != (size_t)len[i]) return 1;
    fclose(f);
  }
  struct jpeg_decompress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_decompress(&c);
  unsigned char* out = NULL;
  size_t cap = 0;
  for (int pass = 0; pass < 3; pass++) {
    for (int num = 8; num >= 1; num--) {
      double t0 = cpu_now(), px = 0;
      for (int i = 0; i < n; i++) {
        jpeg_mem_src(&c, buf[i], len[i]);
        jpeg_read_header(&c, TRUE);
        c.out_color_space = JCS_RGB;
        c.scale_num = num;
        c.scale_denom = 8;
        c.dct_method = JDCT_ISLOW;
        jpeg_start_decompress(&c);
        size_t need = (size_t)c.output_width * c.output_height * 3;
        if (need > cap) out = realloc(out, cap = need);
        px += (double)c.output_width * c.output_height;
        while (c.output_scanline < c.output_height) {
          JSAMPROW row = out + (size_t)c.output_scanline * c.output_width * 3;
          jpeg_read_scanlines(&c, &row, 1);
        }
        jpeg_finish_decompress(&c);
      }
      if (pass == 2) printf("scale %d/8: %7.1f us/image, %8.0f output pixels/image\n", num, (cpu_now() - t0) / n * 1e6, px / n);
    }
  }
  jpeg_destroy_decompress(&c);
  return 0;
}
