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

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n) {
    const unsigned char c = p[0];
    size_t len;
    unsigned min;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

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
            size_t len = utf8_len(p + i, n - i);
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
