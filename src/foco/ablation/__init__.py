"""The paper's ablation table (FoCo Tables 2-5) with one command, `foco ablate`: the variants by name
(`variants`), the runner (`run`) and the statistics that tell a delta from noise (`stats`)."""
