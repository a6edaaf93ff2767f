"""The gateway's REST routes, one router per resource, in the order the app serves them."""

from fastapi import APIRouter

from services.gateway.routes import audit, budgets, dashboard, health, jobs, models

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    dashboard.router,
    jobs.router,
    models.router,
    budgets.router,
    audit.router,
)
