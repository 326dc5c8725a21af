/*
 * json_out.c - the CLI's one way to put a string or a number into JSON
 * output (reports, --json, bench summaries): strings quoted, with '"', '\\'
 * and control bytes escaped and any byte that is not part of valid UTF-8
 * written as U+FFFD (a model folder may be named with byte 0xff), so every
 * JSON epx writes parses; numbers that are not finite written as null, as
 * strict JSON has no NaN or infinity.
 */
#include "cli.h"

#include <math.h>
#include <string.h>

void cli_json_strn(FILE *f, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    if (s == NULL) n = 0;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            fputc(c, f);
            i++;
        } else {
            size_t len = epxi_utf8_len(p + i, n - i);
            if (len == 0) {
                fputs("\\ufffd", f);
                i++;
            } else {
                fwrite(p + i, 1, len, f);
                i += len;
            }
        }
    }
    fputc('"', f);
}

void cli_json_str(FILE *f, const char *s) { cli_json_strn(f, s, s ? strlen(s) : 0); }

/* fmt is one of the callers' literal printf formats of a double. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
void cli_json_num(FILE *f, const char *fmt, double x) {
    if (isfinite(x))
        fprintf(f, fmt, x);
    else
        fputs("null", f);
}
#pragma GCC diagnostic pop
