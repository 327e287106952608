"""Typed view of `service/dispatch/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.dispatch.dispatcher import Dispatcher as Dispatcher
from posbias.service.dispatch.placement import engine_device as engine_device
from posbias.service.dispatch.ray_connect import init_ray as init_ray

__all__ = ["Dispatcher", "engine_device", "init_ray"]
