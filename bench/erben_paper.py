"""The setups of Erben, Mayer, Jacobsen (PVLDB 17(6): 1214-1226, VLDB'24) and the figures its text
states, typed in with their section, table or figure and PVLDB page (bench/erben_tables.py sets our
predictions beside them).

A figure marked "derived" follows from stated ones by the formula given with it; figures only
readable off a plot are left out. Setups (Table 2, Sec. 5): A-n, n T4 VMs in one GC zone; B-n, half
in the US, half in the EU; C-n, spread over the US, EU, ASIA and AUS (C-6: no AUS); D-1, 4 GC VMs in
us-west; D-2, 2 GC + 2 AWS; D-3, 2 GC + 2 Azure.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_BATCH = 32768  # "TBS of 32K" (Sec. 4, experimental design, p. 1218)
US, EU, ASIA, AUS = (
    "gcp/us-central1",
    "gcp/europe-west1",
    "gcp/asia-east1",
    "gcp/australia-southeast1",
)
GC_WEST, AWS_WEST, AZURE_SOUTH = "gcp/us-west1", "aws/us-west-2", "azure/southcentralus"
# Sec. 4 and 5: GC n1-standard-8, AWS g4dn.2xlarge, Azure NC4as_T4_v3, one T4 each
VM_TYPES = {"gcp": "n1-standard-8", "aws": "g4dn.2xlarge", "azure": "NC4as_T4_v3"}


@dataclass(frozen=True)
class Setup:
    name: str
    places: tuple[tuple[str, int], ...]  # (place, VMs there)
    baseline: str | None  # same GPU count in one place, for the geographic slowdown

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.places)


def _setups() -> dict[str, Setup]:
    out = {f"A-{n}": Setup(f"A-{n}", ((US, n),), None) for n in (1, 2, 3, 4, 6, 8)}
    for n in (2, 8):  # Table 2: {1..4}xUS + {1..4}xEU; the text reports B-2 and B-8
        out[f"B-{n}"] = Setup(f"B-{n}", ((US, n // 2), (EU, n // 2)), f"A-{n}")
    out["C-4"] = Setup("C-4", ((US, 1), (EU, 1), (ASIA, 1), (AUS, 1)), "A-4")
    out["C-6"] = Setup("C-6", ((US, 2), (EU, 2), (ASIA, 2)), "A-6")
    out["C-8"] = Setup("C-8", ((US, 2), (EU, 2), (ASIA, 2), (AUS, 2)), "A-8")
    out["D-1"] = Setup("D-1", ((GC_WEST, 4),), None)
    out["D-2"] = Setup("D-2", ((GC_WEST, 2), (AWS_WEST, 2)), "D-1")
    out["D-3"] = Setup("D-3", ((GC_WEST, 2), (AZURE_SOUTH, 2)), "D-1")
    return out


SETUPS = _setups()


@dataclass(frozen=True)
class Published:
    setup: str
    model: str  # CV | NLP
    metric: str  # one of METRICS
    value: float
    cite: str  # section / table / figure and PVLDB page
    derived: str = ""  # the formula over stated figures, when not stated itself
    place: str = ""  # egress_usd_per_vm_h: the VMs it is about ("" = mean over all)
    approximate: bool = False  # the text gives a range or a word, not a figure
    # a cost the paper puts together from two setups: (setup, place) whose internal egress per VM
    # it adds to this setup's VMs (its 8xT4 figure takes D-2/3's, Sec. 7)
    reference: tuple[str, str] | None = None


THROUGHPUT = "samples_per_s"
METRICS = {
    "samples_per_s": "throughput (samples/s)",
    "slowdown_pct": "geographic slowdown vs one zone, same GPUs (%)",
    "granularity": "granularity (compute s / communication s)",
    "usd_per_1m": "$ per 1M samples",
    "egress_usd_per_vm_h": "egress $/h per VM",
}

# Figures stated in the text. Per-GPU speedup = throughput / (GPUs x A-1 throughput).
S4A = "Sec. 4(A) text, Fig. 7, pp. 1219-20"
PER_GPU_SPEEDUP = {  # A-8 (S4A)
    "CV": {2: 0.43, 3: 0.42, 4: 0.43, 6: 0.41, 8: 0.41},
    "NLP": {2: 0.51, 3: 0.47, 4: 0.45, 6: 0.40, 8: 0.34},
}
S4B = "Sec. 4(B) text, Fig. 8a, pp. 1219-20"
A2_SPS = {"CV": 70.1, "NLP": 211.4}  # S4B: the intra-zone (US) two-VM run
B2_SPS = {"CV": 68.4, "NLP": 177.3}  # S4B
T6 = "Table 6 (8xT4 column), p. 1222"
A8_SPS = {"CV": 261.9, "NLP": 575.1}  # T6: the 8xT4 run of Sec. 4, i.e. A-8
S4C = "Sec. 4(C) text, Fig. 9, pp. 1219-20"
S4B_SUMMARY = "Sec. 4(B) summary text, pp. 1219-20"
SLOWDOWN_PCT = {  # vs A-n; B-8: S4B_SUMMARY, C-n: S4C
    ("B-8", "CV"): 2,
    ("B-8", "NLP"): 22,
    ("C-4", "CV"): 9,
    ("C-4", "NLP"): 36,
    ("C-6", "CV"): 7,
    ("C-6", "NLP"): 35,
    ("C-8", "CV"): 7,
    ("C-8", "NLP"): 41,
}
C8_NLP_VM_USD_H = (4.329, 4.804)  # Sec. 5(2), Fig. 11b, p. 1221: egress, total $/h per GC VM
GC_SPOT_USD_H = 0.180  # Table 1, p. 1214


def _paper() -> list[Published]:
    rows: list[Published] = []
    for m in ("CV", "NLP"):
        speedup = PER_GPU_SPEEDUP[m][2]
        a1 = A2_SPS[m] / (2 * speedup)
        rows.append(
            Published("A-1", m, "samples_per_s", a1, f"{S4A}; {S4B}", f"A-2 / (2 x {speedup})")
        )
        rows.append(Published("A-2", m, "samples_per_s", A2_SPS[m], S4B))
        for n in (3, 4, 6):
            speedup = PER_GPU_SPEEDUP[m][n]
            rows.append(
                Published(
                    f"A-{n}", m, "samples_per_s", n * speedup * a1, S4A, f"{n} x {speedup} x A-1"
                )
            )
        rows.append(Published("A-8", m, "samples_per_s", A8_SPS[m], T6))
        rows.append(Published("B-2", m, "samples_per_s", B2_SPS[m], S4B))
        slow = 100 * (1 - B2_SPS[m] / A2_SPS[m])
        rows.append(Published("B-2", m, "slowdown_pct", slow, S4B, "1 - B-2 / A-2"))
    for (setup, m), pct in SLOWDOWN_PCT.items():
        cite = S4C if setup[0] == "C" else S4B_SUMMARY
        rows.append(Published(setup, m, "slowdown_pct", pct, cite))
        base = next(r for r in rows if r.setup == SETUPS[setup].baseline and r.model == m)
        thr = base.value * (1 - pct / 100)
        formula = f"{base.setup} x (1 - {pct}%)"
        rows.append(Published(setup, m, "samples_per_s", thr, f"{cite}; {base.cite}", formula))
    s5 = "Sec. 5(1) text, Fig. 10, p. 1220"
    for setup, pct, words in (("D-2", 0.0, "'essentially identical'"), ("D-3", 1.5, "'1-2%'")):
        for m in ("CV", "NLP"):
            rows.append(
                Published(setup, m, "slowdown_pct", pct, f"{s5}: {words}", approximate=True)
            )
    rows += [
        Published("A-8", "CV", "granularity", 5.19, "Sec. 7 cost analysis (Fig. 7b), p. 1223"),
        Published("A-8", "NLP", "granularity", 1.15, S4A),
        Published("C-8", "CV", "granularity", 3.33, S4C),
        Published("C-8", "NLP", "granularity", 0.4, S4C),
        Published("D-1", "CV", "granularity", 14.48, s5),
        Published("D-1", "NLP", "granularity", 2.73, s5),
        Published("D-3", "CV", "granularity", 12.72, s5),
        Published("D-3", "NLP", "granularity", 1.99, s5),
        Published(
            "A-8",
            "CV",
            "usd_per_1m",
            1.77,
            "Sec. 7 cost analysis, p. 1223: A-8's VMs + the internal egress per GC VM of Fig. 11a "
            "(D-2/3; predicted: D-2's)",
            reference=("D-2", GC_WEST),
        ),
    ]
    s52 = "Sec. 5(2) text, Fig. 11a, p. 1221"
    rows += [
        Published("D-3", "NLP", "egress_usd_per_vm_h", 0.763, s52, place=AZURE_SOUTH),
        Published("D-3", "CV", "egress_usd_per_vm_h", 0.115, s52, place=AZURE_SOUTH),
        Published(
            "D-3",
            "NLP",
            "egress_usd_per_vm_h",
            2.2 * GC_SPOT_USD_H,
            s52,
            "2.2 x GC spot $0.180/h (D-2 or D-3: not said)",
            GC_WEST,
        ),
        Published(
            "C-8", "NLP", "egress_usd_per_vm_h", C8_NLP_VM_USD_H[0], "Sec. 5(2), Fig. 11b, p. 1221"
        ),
    ]
    c8 = next(r.value for r in rows if (r.setup, r.model, r.metric) == ("C-8", "NLP", THROUGHPUT))
    rows.append(
        Published(
            "C-8",
            "NLP",
            "usd_per_1m",
            8 * C8_NLP_VM_USD_H[1] / (c8 * 3600) * 1e6,
            "Sec. 5(2), Fig. 11b, p. 1221",
            "8 x $4.804/h / C-8 throughput (incl. data loading)",
        )
    )
    return rows


PAPER = _paper()


AZURE_SPOT_USD_H = 0.134  # Table 1, p. 1214


def paper_view(setup: str, model: str, metric: str, place: str = "") -> float | None:
    """The paper's figure for a setup, as PAPER types it; None where the text gives none."""
    if (setup, model, metric) == ("C-8", "NLP", "egress_share"):
        return C8_NLP_VM_USD_H[0] / C8_NLP_VM_USD_H[1]  # mean VM's $/h (Fig. 11b)
    found = [
        r.value
        for r in PAPER
        if (r.setup, r.model, r.metric, r.place) == (setup, model, metric, place)
    ]
    return found[0] if found else None
