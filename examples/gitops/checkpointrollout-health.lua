-- Argo CD health of a CheckpointRollout (rollout.ckpt.dev/v1alpha1), read from the status the
-- operator writes. Without it Argo CD shows every rollout Healthy, even one that rolled back.
-- Embedded in argocd-health.yaml; e2e/tests/test_gitops_health.py runs it on real rollouts.
local hs = {}

local function condition(status, kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function say(health, message)
  hs.status = health
  hs.message = message
  return hs
end

local status = obj.status
if status == nil or status.phase == nil then
  return say("Progressing", "Waiting for the operator to report the rollout's status")
end

-- A status written for an older spec says nothing about the new one: a version Git just
-- synced must not show as Healthy until the operator has picked it up.
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  return say("Progressing", "Waiting for the operator to observe generation " .. generation)
end

local message = status.message
if message == nil or message == "" then
  message = status.phase
end

-- Stalled: blocked on something only a user can fix (another rollout selects the same pods),
-- whatever the phase says, so it is read before the phase (a Succeeded rollout stalled by a
-- newer overlapping one is not Healthy); kstatus, which Flux waits on, reads it as Failed too.
-- The condition's message names the cause.
local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  if stalled.message ~= nil and stalled.message ~= "" then
    message = stalled.message
  end
  return say("Degraded", message)
end

local phase = status.phase
if phase == "Succeeded" then
  return say("Healthy", message)
end
if phase == "Failed" or phase == "RolledBack" then
  return say("Degraded", message)
end
if phase == "Paused" then
  return say("Suspended", message)
end

if phase == "Pending" or phase == "Progressing" or phase == "RollingBack" then
  return say("Progressing", message)
end
return say("Unknown", "Unknown phase " .. tostring(phase) .. ": " .. message)
