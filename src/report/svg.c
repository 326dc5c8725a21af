/*
 * svg.c - the visual report as one self-contained SVG.
 *
 * A person should see at a glance which layout is balanced and what each
 * step changed: one heatmap panel per layout (rows = layers, columns = GPUs)
 * coloured by load relative to the layer's mean GPU load. On one shared
 * scale the worst layout (the trivial one, up to 1.8x the mean) would wash
 * the better ones out to the pale middle, so each panel has its own scale,
 * stretched to its own hottest cell and drawn under it. Beside each panel a
 * max-load strip shows, per layer, what the step from the panel to its left
 * changed in the layer's hottest GPU / mean: blue where it fell, red where
 * it rose, on a scale of the panel's largest change (the first panel's
 * strip holds its own maxima, on its own scale).
 * Below them, balancedness per layer for each layout with the bound as a
 * dashed line. Plain SVG 1.1 with no script or external reference, so
 * browsers, rsvg-convert and GitHub render it alike.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define MAX_SERIES 6

/* Line colours (colour-blind safe, Okabe-Ito). */
static const char *const LINE_COLOURS[MAX_SERIES] = {"#999999", "#E69F00", "#0072B2",
                                                     "#009E73", "#CC79A7", "#D55E00"};

/* A perceptually ordered ramp from cool (under-loaded) through pale (the
 * mean) to hot (over-loaded): t in [0, 1], 0.5 is the mean. */
static void heat_colour(double t, char out[8]) {
    static const double stops[5][3] = {
        {49, 54, 149}, {116, 173, 209}, {255, 255, 224}, {244, 109, 67}, {165, 0, 38}};
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    double x = t * 4;
    int i = (int)x;
    if (i > 3) i = 3;
    double f = x - i;
    int rgb[3];
    for (int c = 0; c < 3; c++)
        rgb[c] = (int)lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]));
    snprintf(out, 8, "#%02x%02x%02x", rgb[0] & 255, rgb[1] & 255, rgb[2] & 255);
}

/* Map a load ratio (load / mean) onto the ramp: [0, 1] -> [0, 0.5] and
 * [1, rmax] -> [0.5, 1], so the mean always sits at the pale middle. */
static double ratio_to_t(double r, double rmax) {
    if (r <= 1) return 0.5 * r;
    return 0.5 + 0.5 * (r - 1) / (rmax - 1);
}

/* Text as XML: markup characters escaped, control bytes dropped, and a
 * byte that is not part of valid UTF-8 written as U+FFFD, so the file stays
 * well-formed whatever a title or a series name holds. */
static void put_escaped(FILE *f, const char *s) {
    const size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            const size_t len = epxi_utf8_len((const unsigned char *)s + i, n - i);
            if (len == 0) {
                fputs("\xef\xbf\xbd", f);
                i++;
            } else {
                fwrite(s + i, 1, len, f);
                i += len;
            }
            continue;
        }
        switch (c) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if (c >= 0x20 || c == '\t') fputc(c, f);
        }
        i++;
    }
}

typedef struct report_ctx {
    int32_t L, G, n;
    const epx_report_series *series;
    const double *bound;
    const char *title, *subtitle;
} report_ctx;

/* Largest load ratio of one panel: the top of its own scale (at least
 * 1.01, so a perfect layout still has a ramp). */
static double panel_rmax(const report_ctx *c, int32_t s) {
    double rmax = 1.01;
    for (int32_t l = 0; l < c->L; l++) {
        const double *row = c->series[s].gpu_load + (size_t)l * (size_t)c->G;
        const epxi_gpu_summary gs = epxi_gpu_summarize(row, c->G, NULL);
        if (gs.total <= 0) continue;
        const double mean = gs.total / gs.live;
        for (int32_t g = 0; g < c->G; g++)
            if (row[g] / mean > rmax) rmax = row[g] / mean;
    }
    return rmax;
}

/* A layer's hottest GPU / mean GPU load in panel s; -1 without load. */
static double layer_max(const report_ctx *c, int32_t s, int32_t l) {
    const double *row = c->series[s].gpu_load + (size_t)l * (size_t)c->G;
    const epxi_gpu_summary gs = epxi_gpu_summarize(row, c->G, NULL);
    if (gs.total <= 0) return -1;
    double mx = 0;
    for (int32_t g = 0; g < c->G; g++) mx = row[g] > mx ? row[g] : mx;
    return mx / (gs.total / gs.live);
}

/* The largest change of a layer's max from panel s - 1 to s (at least
 * 0.001, so equal panels still have a scale). */
static double panel_dmax(const report_ctx *c, int32_t s) {
    double d = 0.001;
    for (int32_t l = 0; l < c->L; l++) {
        const double a = layer_max(c, s - 1, l), b = layer_max(c, s, l);
        if (a >= 0 && b >= 0 && fabs(b - a) > d) d = fabs(b - a);
    }
    return d;
}

static epx_status write_body(FILE *f, const void *vctx, epx_error *err) {
    (void)err;
    const report_ctx *c = vctx;
    /* Geometry: panels of fixed width with their max-load strip beside them;
     * cell height shrinks with many layers. */
    const double panel_w = 260, left = 60, top = 96, gap = 60, strip_x = 6, strip_w = 12;
    const double cell_w = panel_w / c->G;
    double cell_h = c->L <= 64 ? 6 : 384.0 / c->L;
    if (cell_h < 1) cell_h = 1;
    const double panel_h = cell_h * c->L;
    const double legend_x = left + c->n * (panel_w + gap);
    const double width = legend_x + 130;
    const double chart_top = top + panel_h + 110, chart_h = 220;
    const double chart_w = width - left - 40;
    const double height = chart_top + chart_h + 80;

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
    fputs("<text x=\"20\" y=\"30\" font-size=\"20\" font-weight=\"bold\">", f);
    put_escaped(f, c->title);
    fputs("</text>\n", f);
    if (c->subtitle) {
        fputs("<text x=\"20\" y=\"52\" font-size=\"13\" fill=\"#444\">", f);
        put_escaped(f, c->subtitle);
        fputs("</text>\n", f);
    }

    /* Heatmaps. */
    for (int32_t s = 0; s < c->n; s++) {
        const epx_report_series *se = &c->series[s];
        double x0 = left + s * (panel_w + gap);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">", x0,
                top - 24);
        put_escaped(f, se->name);
        const double prmax = panel_rmax(c, s), dmax = s > 0 ? panel_dmax(c, s) : 0;
        fprintf(f,
                "</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\">"
                "balancedness %.3f; hottest GPU %.2fx mean</text>\n",
                x0, top - 9, se->overall, prmax);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\">max"
                "</text>\n",
                x0 + panel_w + strip_x + strip_w / 2, top - 3);
        fprintf(f, "<g shape-rendering=\"crispEdges\">\n");
        for (int32_t l = 0; l < c->L; l++) {
            const double *row = se->gpu_load + (size_t)l * (size_t)c->G;
            const epxi_gpu_summary gs = epxi_gpu_summarize(row, c->G, NULL);
            const double mean = gs.total / gs.live;
            double mx = 0;
            for (int32_t g = 0; g < c->G; g++) {
                char col[8];
                if (gs.total <= 0)
                    snprintf(col, sizeof col, "#eeeeee"); /* dense layer */
                else
                    heat_colour(ratio_to_t(row[g] / mean, prmax), col);
                if (gs.total > 0 && row[g] / mean > mx) mx = row[g] / mean;
                fprintf(
                    f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n",
                    x0 + g * cell_w, top + l * cell_h, cell_w, cell_h, col);
            }
            /* the max-load strip: the change from the panel to the left */
            char col[8];
            const double before = s > 0 ? layer_max(c, s - 1, l) : -1;
            if (gs.total <= 0 || (s > 0 && before < 0))
                snprintf(col, sizeof col, "#eeeeee");
            else if (s == 0)
                heat_colour(ratio_to_t(mx, prmax), col);
            else
                heat_colour(0.5 + 0.5 * (mx - before) / dmax, col);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n",
                    x0 + panel_w + strip_x, top + l * cell_h, strip_w, cell_h, col);
        }
        fputs("</g>\n", f);
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                "stroke=\"#333\"/>\n",
                x0 + panel_w + strip_x, top, strip_w, panel_h);
        /* This panel's own scale, under it: 0, the mean, its hottest cell. */
        const double sy = top + panel_h + 34;
        for (int i = 0; i < 64; i++) {
            char bc[8];
            heat_colour((i + 0.5) / 64.0, bc);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"8\" fill=\"%s\"/>\n",
                    x0 + i * panel_w / 64, sy, panel_w / 64 + 0.3, bc);
        }
        const double pticks[3] = {0.0, 1.0, prmax};
        for (int i = 0; i < 3; i++)
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"%s\">%.2f%s"
                    "</text>\n",
                    x0 + ratio_to_t(pticks[i], prmax) * panel_w, sy + 18,
                    i == 0   ? "start"
                    : i == 1 ? "middle"
                             : "end",
                    pticks[i], i == 1 ? " (mean)" : "");
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#444\">this panel's "
                "scale: load / mean</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" "
                "fill=\"#444\">",
                x0, sy + 30, x0, sy + 41);
        if (s == 0) {
            fputs("max strip: each layer's hottest GPU, this scale", f);
        } else {
            fputs("max strip: change vs ", f);
            put_escaped(f, c->series[s - 1].name);
            fprintf(f, ", \xc2\xb1%.3f", dmax);
        }
        fputs("</text>\n", f);
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                "stroke=\"#333\"/>\n",
                x0, top, panel_w, panel_h);
        /* Axis labels: GPUs along the bottom, layers down the side. */
        int32_t gstep = c->G <= 16 ? 1 : c->G / 8;
        for (int32_t g = 0; g < c->G; g += gstep)
            fprintf(
                f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\">%d</text>\n",
                x0 + (g + 0.5) * cell_w, top + panel_h + 12, g);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">GPU</text>\n",
                x0 + panel_w / 2, top + panel_h + 26);
        int32_t lstep = c->L <= 16 ? 1 : (c->L + 9) / 10;
        for (int32_t l = 0; l < c->L; l += lstep)
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"end\">%d</text>\n",
                    x0 - 3, top + (l + 0.5) * cell_h + 3, l);
        if (s == 0)
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" "
                    "transform=\"rotate(-90 %.1f %.1f)\">layer</text>\n",
                    left - 32, top + panel_h / 2, left - 32, top + panel_h / 2);
    }

    /* The strips' legend: the diverging ramp, lower (better) to higher. */
    const double bar_h = panel_h < 120 ? 120 : panel_h, bar_x = legend_x + 10;
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">max strips</text>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#444\">change from the "
            "panel</text><text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#444\">to the "
            "left</text>\n",
            bar_x - 10, top - 26, bar_x - 10, top - 15, bar_x - 10, top - 5);
    for (int i = 0; i < 64; i++) {
        char col[8];
        heat_colour(1.0 - (i + 0.5) / 64.0, col);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.2f\" width=\"16\" height=\"%.2f\" fill=\"%s\"/>\n",
                bar_x, top + i * bar_h / 64, bar_h / 64 + 0.3, col);
    }
    static const char *const marks[3] = {"higher (worse)", "same", "lower (better)"};
    for (int i = 0; i < 3; i++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%s</text>\n", bar_x + 20,
                top + i * bar_h / 2 +
                    (i == 0   ? 8
                     : i == 1 ? 4
                              : 0),
                marks[i]);
    fprintf(
        f,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#eeeeee\" stroke=\"#999\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">no load</text>\n",
        bar_x, top + bar_h + 10, bar_x + 14, top + bar_h + 19);

    /* Balancedness per layer. */
    fprintf(
        f,
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">Balancedness per layer "
        "(mean GPU load / max GPU load; 1.0 is perfect)</text>\n",
        left, chart_top - 12);
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            left, chart_top, chart_w, chart_h);
    /* The y axis starts at the lowest tenth below every series, so close
     * curves near 1.0 stay distinguishable. */
    double ymin = 1.0;
    for (int32_t s = -1; s < c->n; s++) {
        const double *v = s < 0 ? c->bound : c->series[s].balancedness;
        for (int32_t l = 0; v != NULL && l < c->L; l++)
            if (v[l] >= 0 && v[l] < ymin) ymin = v[l];
    }
    ymin = floor(ymin * 10) / 10;
    if (ymin > 0.9) ymin = 0.9;
    if (ymin < 0) ymin = 0;
#define YPOS(v) (chart_top + chart_h * (1 - ((v)-ymin) / (1 - ymin)))
    for (int i = 0; i <= 4; i++) {
        double v = ymin + (1 - ymin) * i / 4.0, y = YPOS(v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%.2f</text>\n",
                left, y, left + chart_w, y, left - 4, y + 3, v);
    }
    const double dx = c->L > 1 ? chart_w / (c->L - 1) : 0;
    int32_t lstep = c->L <= 16 ? 1 : (c->L + 9) / 10;
    for (int32_t l = 0; l < c->L; l += lstep)
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
                left + l * dx, chart_top + chart_h + 14, l);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">layer</text>\n",
            left + chart_w / 2, chart_top + chart_h + 30);
    for (int32_t s = -1; s < c->n; s++) {
        const double *v = s < 0 ? c->bound : c->series[s].balancedness;
        if (v == NULL) continue;
        const char *col = s < 0 ? "#000000" : LINE_COLOURS[s % MAX_SERIES];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", col,
                s < 0 ? "1" : "2", s < 0 ? " stroke-dasharray=\"4 3\"" : "");
        for (int32_t l = 0; l < c->L; l++)
            if (v[l] >= 0) fprintf(f, "%.1f,%.1f ", left + l * dx, YPOS(v[l]));
        fputs("\"/>\n", f);
    }
    /* Legend under the chart. */
    double lx = left;
    const double ly = chart_top + chart_h + 50;
    for (int32_t s = -1; s < c->n; s++) {
        if (s < 0 && c->bound == NULL) continue;
        const char *col = s < 0 ? "#000000" : LINE_COLOURS[s % MAX_SERIES];
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>",
                lx, ly, lx + 24, ly, col, s < 0 ? " stroke-dasharray=\"4 3\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", lx + 30, ly + 4);
        put_escaped(f, s < 0 ? "bound (best possible)" : c->series[s].name);
        fputs("</text>\n", f);
        lx += 200;
    }
#undef YPOS
    fputs("</svg>\n", f);
    return ferror(f) ? EPX_ERR_IO : EPX_OK;
}

epx_status epx_report_write_svg(const char *path, int32_t L, int32_t G,
                                const epx_report_series *series, int32_t n, const double *bound,
                                const char *title, const char *subtitle, epx_error *err) {
    if (path == NULL || series == NULL || title == NULL)
        return epxi_fail(err, EPX_ERR_INVALID_ARG, "report: path, series and title are required");
    if (L < 1 || G < 1 || n < 1 || n > MAX_SERIES)
        return epxi_fail(err, EPX_ERR_INVALID_ARG,
                         "report: %d layers, %d GPUs, %d series; need >= 1 each and at most %d "
                         "series",
                         L, G, n, MAX_SERIES);
    for (int32_t s = 0; s < n; s++) {
        if (series[s].gpu_load == NULL || series[s].name == NULL)
            return epxi_fail(err, EPX_ERR_INVALID_ARG, "report: series %d lacks a name or loads",
                             s);
        char what[48];
        snprintf(what, sizeof what, "series[%d].gpu_load", s);
        EPX_TRY(epxi_check_loads(series[s].gpu_load, (size_t)L * (size_t)G, what, err));
        /* figures print as text: NaN or inf would be written as "nan" */
        if (!isfinite(series[s].overall))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "report: series %d's overall is %g: it must be finite", s,
                             series[s].overall);
        for (int32_t l = 0; series[s].balancedness && l < L; l++)
            if (!isfinite(series[s].balancedness[l]))
                return epxi_fail(err, EPX_ERR_INVALID_ARG,
                                 "report: series %d's balancedness[%d] is %g: it must be finite "
                                 "(< 0 for a layer without load)",
                                 s, l, series[s].balancedness[l]);
    }
    for (int32_t l = 0; bound && l < L; l++)
        if (!isfinite(bound[l]))
            return epxi_fail(err, EPX_ERR_INVALID_ARG,
                             "report: bound[%d] is %g: it must be finite (< 0 where undefined)", l,
                             bound[l]);
    report_ctx c = {L, G, n, series, bound, title, subtitle};
    return epxi_write_atomically(path, write_body, &c, err);
}
