"""Synthetic training jobs with injected faults: the paper's five case studies and healthy runs."""

from argus_core.simulate.cases import CASES, Case, Expectation
from argus_core.simulate.faults import Fault, parse_fault
from argus_core.simulate.model import SimConfig, retimed, simulate, simulate_trace
from argus_core.simulate.noise import REAL_CPU, NoiseModel, fit_noise
from argus_core.simulate.writer import write_records

__all__ = ["CASES", "REAL_CPU", "Case", "Expectation", "Fault", "NoiseModel", "SimConfig",
           "fit_noise", "parse_fault", "retimed", "simulate", "simulate_trace", "write_records"]
